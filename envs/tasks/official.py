"""The official `swebench` package (optional extra `jaxswe[swebench]`), the one place it is imported.

It is the source of truth for what a published SWE-bench record leaves out: the per-repo/version
spec (test command, eval commands, install recipe), the test directives taken from test_patch,
the instance image name and the log parsers (by name or by repo). jaxswe's own pytest/Django
parsers (envs.tasks.parsers) are tested against these on real logs and serve when it is absent.

The package is imported lazily (it is slow to import); `require()` raises one clear TaskError.
swebench 4.x ships the per-repo spec tables (5.x moved them into its task repositories), so the
extra pins 4.x; the 5.x grading rules (truncated ids, skipped tests) live in envs.tasks.parsers.
"""

from __future__ import annotations

import functools
import importlib
import posixpath
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from envs.errors import TaskError

INSTALL_HINT = "install the official swebench package: pip install 'jaxswe[swebench]'"
_PARSER_MODULES = ("python", "javascript", "c", "go", "java", "php", "ruby", "rust")


@functools.cache
def _module(name: str):
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def available() -> bool:
    return _module("swebench.harness.constants") is not None


def require(why: str) -> None:
    """Raise one clear TaskError when the swebench package is missing."""
    if not available():
        raise TaskError(f"{why} needs the official SWE-bench specs; {INSTALL_HINT}")


def spec(repo: str, version: str) -> dict[str, Any] | None:
    """SWE-bench's spec of `repo` at `version` (test_cmd, eval_commands, install, ...), or None."""
    constants = _module("swebench.harness.constants")
    table = getattr(constants, "MAP_REPO_VERSION_TO_SPECS", None) if constants else None
    if table is None:
        return None
    return table.get(repo, {}).get(str(version))


def knows_repo(repo: str) -> bool:
    constants = _module("swebench.harness.constants")
    table = getattr(constants, "MAP_REPO_VERSION_TO_SPECS", None) if constants else None
    return bool(table) and repo in table


def requirement_paths(repo: str) -> list[str]:
    """Where SWE-bench reads a repository's requirements for `packages: requirements.txt` (the
    first that exists at the environment commit; Django: tests/requirements/py3.txt)."""
    constants = _module("swebench.harness.constants")
    return list(getattr(constants, "MAP_REPO_TO_REQS_PATHS", {}).get(repo, [])) if constants else []


def requirements(paths: list[str], read: Callable[[str], str | None]) -> tuple[str, str] | None:
    """(path, text) of the first requirements file of `paths` that `read` finds (None: none), as
    swebench's `get_requirements_by_commit` builds it, reading the repository at the environment
    commit instead of GitHub: `-r` files of the same directory inlined, `-e .`, `.[test` and comment
    lines dropped, then swebench's own `clean_requirements` (yanked packages replaced)."""
    for path in paths:
        text = read(path)
        if text is not None:
            break
    else:
        return None
    here = posixpath.dirname(path)

    def kept(line: str) -> bool:
        return not any(line.strip().startswith(x) for x in ("-e .", "#", ".[test"))

    inlined, own = [], []
    for line in text.split("\n"):
        if line.strip().startswith("-r"):
            extra = read(posixpath.join(here, line.strip()[2:].strip())) or ""
            inlined += [x for x in extra.split("\n") if kept(x)]
        elif kept(line):
            own.append(line)
    module = _module("swebench.harness.test_spec.python")
    return path, module.clean_requirements("\n".join([*inlined, "\n".join(own)]))


def repo_install(repo: str) -> str | None:
    """swebench's repository-wide install step (MAP_REPO_TO_INSTALL), run before the spec's own."""
    constants = _module("swebench.harness.constants")
    return (getattr(constants, "MAP_REPO_TO_INSTALL", {}) if constants else {}).get(repo)


def test_directives(record: dict[str, Any]) -> list[str]:
    """SWE-bench's test directives of a record (files test_patch touches; Django: dotted modules)."""
    module = _module("swebench.harness.test_spec.python")
    return list(module.get_test_directives(record))


def instance_image(instance_id: str, namespace: str | None = None, tag: str = "latest") -> str:
    """SWE-bench's instance image name, `sweb.eval.x86_64.<id>:latest` (remote: `swebench/...` with
    `__` -> `_1776_`)."""
    module = _module("swebench.harness.test_spec.test_spec")
    if module is None:
        key = f"sweb.eval.x86_64.{instance_id.lower()}:{tag}"
        return f"{namespace}/{key}".replace("__", "_1776_") if namespace else key
    spec_ = module.TestSpec(
        instance_id=instance_id, repo="", version="", repo_script_list=[], eval_script_list=[],
        env_script_list=[], arch="x86_64", FAIL_TO_PASS=[], PASS_TO_PASS=[], language="py",
        docker_specs={}, namespace=namespace, instance_image_tag=tag,
    )  # fmt: skip
    return spec_.instance_image_key


def _repo_parsers() -> dict[str, Callable]:
    module = _module("swebench.harness.log_parsers")
    return (getattr(module, "MAP_REPO_TO_PARSER", None) or {}) if module else {}


def parser_name(repo: str) -> str | None:
    """The name of SWE-bench's log parser for `repo` (e.g. parse_log_sympy), or None."""
    fn = _repo_parsers().get(repo)
    return None if fn is None else fn.__name__


def parser(name: str | None = None, repo: str | None = None) -> Callable[[str], dict[str, str]] | None:
    """SWE-bench's log parser called `name` (e.g. parse_log_sympy), else the one for `repo`; None
    when the package or the parser is missing. The returned function takes the log only."""
    fn = None
    if name:
        for sub in _PARSER_MODULES:
            module = _module(f"swebench.harness.log_parsers.{sub}")
            if module is not None and callable(getattr(module, name, None)):
                fn = getattr(module, name)
                break
    elif repo:
        fn = _repo_parsers().get(repo)
    if fn is None:
        return None
    test_spec = SimpleNamespace(repo=repo or "", instance_id="", version="")
    return lambda log: dict(fn(log, test_spec))
