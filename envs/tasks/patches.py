"""Unified diffs: which files a patch touches (git's own parser) and which of them the agent may not change.

Grading never splits a patch by hand: the paths come from `git apply --numstat -z` (here, run in
a fresh empty directory with none of the caller's GIT_* variables, envs.host_git.git_outside, so the
caller's working directory never filters them) or from the index after `git apply --index`
(envs.grading.grader), so the file list and what gets applied come from the same parser. Protected paths
(changes there are reset to the base state before grading):

- test paths: the files test_patch touches, anything under a `tests/` directory or a top-level
  `test/` or `testing/` (inside a package those are library code: django/test, sympy/testing),
  `test_*.py`, `*_test.py`, `conftest.py` anywhere;
- test-runner configuration anywhere: pytest.ini, .pytest.ini, pytest.toml, .pytest.toml, tox.ini
  (pyproject.toml and setup.cfg only when their pytest sections change, see envs.grading.grader);
- interpreter start-up hooks: `*.pth`, sitecustomize.py, usercustomize.py;
- installed-distribution metadata anywhere: a `*.dist-info` or `*.egg-info` (any case) and what is
  in it (an `entry_points.txt` there would register a pytest plugin the runner could load);
- `.gitattributes` anywhere (it would change what git shows the grader's scan);
- new files that could shadow the runner or a module: pytest.py, a pytest/ _pytest/ pluggy/
  iniconfig/ package, compiled modules (*.pyc, *.so, *.pyd, __pycache__/), and at an import root
  (the repository root, `src/` in a src layout) a new top-level module or package named like one
  the stdlib, pytest or its dependencies import (`sys.stdlib_module_names`: pdb.py, readline/...).
Importable files that are not text (IMPORTABLE_SUFFIXES with binary content) are reset too
(envs.grading.grader, which reads their content).
"""

from __future__ import annotations

import fnmatch
import re
import sys
from collections.abc import Iterable
from pathlib import PurePosixPath

from envs.host_git import git_outside

_TEST_NAMES = ("test_*.py", "*_test.py", "conftest.py")
RUNNER_CONFIGS = ("pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini")
_STARTUP_NAMES = ("*.pth", "sitecustomize.py", "usercustomize.py")
_METADATA_DIRS = (".dist-info", ".egg-info")  # what importlib.metadata finds distributions by
_SHADOW_PACKAGES = {"pytest", "_pytest", "pluggy", "iniconfig", "jaxswe_grader", "jaxswe_pytest"}
# What pytest and its dependencies import besides the stdlib: a new top-level one would shadow them.
_RUNNER_IMPORTS = _SHADOW_PACKAGES | {"packaging", "exceptiongroup", "tomli", "colorama", "pygments", "py",
                                      "attr", "attrs", "more_itertools", "importlib_metadata", "zipp",
                                      "typing_extensions"}  # fmt: skip
_TOP_LEVEL_SHADOWS = frozenset(sys.stdlib_module_names) | _RUNNER_IMPORTS
_COMPILED = ("*.pyc", "*.pyo", "*.so", "*.pyd")
IMPORTABLE_SUFFIXES = (".py", ".pyw", ".pyc", ".pyo", ".so", ".pyd", ".zip", ".egg", ".whl", ".pyz", ".pth")
_HEADER_RE = re.compile(r"^diff --git ", re.MULTILINE)


class PatchError(ValueError):
    """A patch git cannot parse, or one with a section that has no `diff --git` header."""


def numstat(diff: str) -> list[str]:
    """One path per file section of `diff` (the new name of a rename), from `git apply --numstat -z`.

    Raises PatchError when git cannot parse the diff.
    """
    done = git_outside("apply", "--numstat", "-z", "-", input=diff.encode("utf-8", "surrogateescape"))
    if done.returncode != 0:
        raise PatchError(
            done.stderr.decode("utf-8", "replace").strip()[-300:] or "git cannot parse the patch"
        )
    paths = []
    for entry in done.stdout.split(b"\0"):
        if entry:
            paths.append(entry.split(b"\t", 2)[2].decode("utf-8", "surrogateescape"))
    return paths


def check_git_sections(diff: str) -> list[str]:
    """The paths of `diff` when git parses it and every file section has a `diff --git` header.

    A plain `---/+++` section is refused: git and other tools disagree about such sections, and a
    patch the agent makes with `git diff` never has one.
    """
    paths = numstat(diff)
    headers = len(_HEADER_RE.findall(diff))
    if headers != len(paths):
        raise PatchError(
            f"{len(paths)} file sections but {headers} `diff --git` headers; "
            "every section needs a git header (make the patch with `git diff`)"
        )
    return paths


def patch_files(diff: str) -> list[str]:
    """Paths a diff touches, in order, without duplicates ([] when git cannot parse it)."""
    if not diff.strip():
        return []
    try:
        return list(dict.fromkeys(numstat(diff)))
    except PatchError:
        return []


def is_test_path(path: str, test_files: Iterable[str] = ()) -> bool:
    """Whether `path` is a test file or directory entry the agent's patch may not change."""
    pure = PurePosixPath(path)
    if path in set(test_files):
        return True
    dirs = pure.parts[:-1]
    if "tests" in dirs or dirs[:1] in (("test",), ("testing",)):  # a package's test/, testing/: library
        return True
    return any(fnmatch.fnmatch(pure.name, pat) for pat in _TEST_NAMES)


def is_protected(
    path: str, test_files: Iterable[str] = (), *, new: bool = True, import_roots: Iterable[str] = (".",)
) -> bool:
    """Whether a change to `path` is reset before grading (see the module docstring).

    `new`: the file does not exist at the base commit (shadowing rules apply only to new files,
    so a project may change its own modules even when it is pytest itself). `import_roots`: the
    directories whose top-level modules are importable by name ("." is the repository root).
    """
    pure = PurePosixPath(path)
    name = pure.name
    if is_test_path(path, test_files) or name in RUNNER_CONFIGS or name == ".gitattributes":
        return True
    if any(fnmatch.fnmatch(name, pat) for pat in _STARTUP_NAMES):
        return True
    if any(part.lower().endswith(_METADATA_DIRS) for part in pure.parts):
        return True
    if not new:
        return False
    if "__pycache__" in pure.parts or any(fnmatch.fnmatch(name, pat) for pat in _COMPILED):
        return True
    if name.endswith(".py") and name.removesuffix(".py") in _SHADOW_PACKAGES:
        return True
    if any(part in _SHADOW_PACKAGES for part in pure.parts[:-1]):
        return True
    for root in import_roots:
        rel = pure.parts if root == "." else pure.parts[1:] if pure.parts[:1] == (root,) else ()
        top = rel[0].split(".")[0] if len(rel) > 1 else rel[0].removesuffix(".py") if rel else ""
        if rel and name.endswith(IMPORTABLE_SUFFIXES) and top in _TOP_LEVEL_SHADOWS:
            return True
    return False


def changed_lines(diff: str) -> int:
    """Added plus removed lines of a diff (the paper's `< 500 lines` filter)."""
    return sum(
        1
        for line in diff.splitlines()
        if (line.startswith("+") and not line.startswith("+++ "))
        or (line.startswith("-") and not line.startswith("--- "))
    )
