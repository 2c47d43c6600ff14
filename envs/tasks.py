"""Task records: SWE-bench / SWE-rebench JSON or JSONL, and the built-in suite.

A task names where its repository comes from: its Docker image (SWE images hold it at /testbed),
a clone in `$JAXSWE_REPOS_DIR/<owner>__<name>` (local backend, per-task images), or the built-in
package data (`source_dir`, a materialized git repository).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.errors import TaskError
from envs.parsers import PARSERS
from envs.patches import patch_files

DEFAULT_TEST_CMD = "pytest -rA"
_REQUIRED = ("instance_id", "repo", "base_commit", "patch", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS")


@dataclass(frozen=True)
class Task:
    """One SWE task. Test lists are tuples of test ids as the log parser names them."""

    instance_id: str
    repo: str
    base_commit: str
    patch: str
    test_patch: str
    problem_statement: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    test_cmd: str = DEFAULT_TEST_CMD
    test_directives: tuple[str, ...] = ()  # appended to test_cmd (SWE-bench: files test_patch touches)
    log_parser: str = "pytest"
    image: str | None = None
    version: str = ""
    source_dir: str | None = field(default=None, compare=False)  # a git repo holding base_commit (built-in)
    raw: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def test_command(self) -> str:
        return " ".join([self.test_cmd, *self.test_directives])

    def repos_dir_clone(self, *, missing_ok: bool = False) -> Path | None:
        """`$JAXSWE_REPOS_DIR/<owner>__<name>` if it exists (else None, or the path if missing_ok)."""
        root = Path(os.environ.get("JAXSWE_REPOS_DIR", Path.home() / ".cache" / "jaxswe" / "repos"))
        path = root / self.repo.replace("/", "__")
        return path if missing_ok or path.is_dir() else None

    def to_record(self) -> dict[str, Any]:
        """A SWE-bench-style record that `load_tasks` reads back into an equal Task."""
        record = dict(self.raw)
        record.update(
            {
                "instance_id": self.instance_id,
                "repo": self.repo,
                "base_commit": self.base_commit,
                "patch": self.patch,
                "test_patch": self.test_patch,
                "problem_statement": self.problem_statement,
                "FAIL_TO_PASS": list(self.fail_to_pass),
                "PASS_TO_PASS": list(self.pass_to_pass),
                "test_cmd": self.test_cmd,
                "test_directives": list(self.test_directives),
                "log_parser": self.log_parser,
                "image_name": self.image,
                "version": self.version,
            }
        )
        return record


def _fail(index: int, record: Any, name: str, why: str) -> TaskError:
    iid = record.get("instance_id", "?") if isinstance(record, dict) else "?"
    return TaskError(f"task record {index} (instance_id={iid!r}): field {name!r} {why}")


def _test_list(index: int, record: dict, name: str) -> tuple[str, ...]:
    value = record[name]
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise _fail(index, record, name, "is a string that is not a JSON list") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(index, record, name, "must be a list of test names")
    return tuple(value)


def _test_directives(repo: str, test_patch: str) -> tuple[str, ...]:
    """SWE-bench's convention: run the test files test_patch touches (Django: dotted modules)."""
    files = [f for f in patch_files(test_patch) if f.endswith(".py")]
    if repo == "django/django":
        files = [f.removeprefix("tests/").removesuffix(".py").replace("/", ".") for f in files]
    return tuple(files)


def task_from_record(record: Any, index: int = 0, *, source_dir: str | None = None) -> Task:
    """Validate one SWE-bench / SWE-rebench record (or a record written by `Task.to_record`)."""
    if not isinstance(record, dict):
        raise TaskError(f"task record {index}: expected a JSON object, got {type(record).__name__}")
    for name in _REQUIRED:
        if name not in record:
            raise _fail(index, record, name, "is missing")
    for name in ("instance_id", "repo", "base_commit", "patch", "test_patch"):
        if not isinstance(record[name], str):
            raise _fail(index, record, name, "must be a string")
    if not record["instance_id"]:
        raise _fail(index, record, "instance_id", "is empty")
    install = record.get("install_config") or {}
    if isinstance(install, str):
        try:
            install = json.loads(install)
        except json.JSONDecodeError:
            raise _fail(index, record, "install_config", "is not a JSON object") from None
    if not isinstance(install, dict):
        raise _fail(index, record, "install_config", "must be an object")
    test_cmd = record.get("test_cmd") or install.get("test_cmd") or DEFAULT_TEST_CMD
    if isinstance(test_cmd, list):
        test_cmd = " && ".join(test_cmd) if len(test_cmd) > 1 else (test_cmd[0] if test_cmd else "")
    if not isinstance(test_cmd, str) or not test_cmd.strip():
        raise _fail(index, record, "test_cmd", "must be a non-empty command")
    parser = record.get("log_parser") or install.get("log_parser") or "pytest"
    if parser not in PARSERS:
        raise _fail(
            index, record, "log_parser", f"names an unknown parser {parser!r} (known: {sorted(PARSERS)})"
        )
    image = record.get("image_name") or record.get("docker_image") or record.get("image")
    if image is not None and not isinstance(image, str):
        raise _fail(index, record, "image_name", "must be a string")
    if "test_directives" in record:
        directives = record["test_directives"]
        if not isinstance(directives, list) or not all(isinstance(d, str) for d in directives):
            raise _fail(index, record, "test_directives", "must be a list of strings")
        directives = tuple(directives)
    else:
        directives = _test_directives(record["repo"], record["test_patch"])
    if source_dir is None and record["repo"].startswith("builtin/"):
        from envs.builtin import builtin_source

        source_dir = builtin_source(record["instance_id"], record["base_commit"], record.get("builtin_dir"))
    fail_to_pass = _test_list(index, record, "FAIL_TO_PASS")
    if not fail_to_pass:
        raise _fail(index, record, "FAIL_TO_PASS", "is empty (a task needs a failing test)")
    return Task(
        instance_id=record["instance_id"],
        repo=record["repo"],
        base_commit=record["base_commit"],
        patch=record["patch"],
        test_patch=record["test_patch"],
        problem_statement=str(record.get("problem_statement", "")),
        fail_to_pass=fail_to_pass,
        pass_to_pass=_test_list(index, record, "PASS_TO_PASS"),
        test_cmd=test_cmd,
        test_directives=directives,
        log_parser=parser,
        image=image,
        version=str(record.get("version", "")),
        source_dir=source_dir,
        raw=dict(record),
    )


def _read_records(path: Path) -> list[Any]:
    text = path.read_text()
    if path.suffix == ".jsonl":
        records = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise TaskError(f"{path}: line {lineno} is not JSON ({err.msg})") from None
        return records
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise TaskError(f"{path}: not JSON ({err.msg} at line {err.lineno})") from None
    return data if isinstance(data, list) else [data]


def load_tasks(path: str | Path) -> list[Task]:
    """Tasks of a .json (a list or one record) / .jsonl file, or `"builtin"` for the built-in suite."""
    if str(path) == "builtin":
        from envs.builtin import load_builtin

        return load_builtin()
    path = Path(path)
    if path.is_dir():
        from envs.builtin import load_builtin

        return load_builtin(path)
    if not path.is_file():
        raise TaskError(f"task file {path} does not exist")
    tasks = [task_from_record(r, i) for i, r in enumerate(_read_records(path))]
    seen: set[str] = set()
    for i, t in enumerate(tasks):
        if t.instance_id in seen:
            raise TaskError(
                f"task record {i} (instance_id={t.instance_id!r}): field 'instance_id' is duplicated"
            )
        seen.add(t.instance_id)
    return tasks
