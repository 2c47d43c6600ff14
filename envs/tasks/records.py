"""Task records as published: SWE-bench (Verified), SWE-Gym, SWE-rebench V1/V2, SWE-smith, and
the built-in suite, from JSON or JSONL (list fields as lists or JSON strings).

Each format gets its official defaults where the record leaves them out:
- SWE-bench / SWE-Gym (no test command): SWE-bench's spec for repo+version (envs.tasks.official: e.g.
  Django `./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 <modules>`, sympy
  `bin/test -C --verbose <files>`) and its parser for the repo; a repo SWE-bench has no spec for
  runs `pytest -rA <files test_patch touches>`. Image `sweb.eval.x86_64.<id>:latest` (remote
  `swebench/...` with `__` -> `_1776_`), repository at /testbed, tools in conda env `testbed`.
- SWE-rebench V1: `install_config` (python, packages, pip_packages, pre_install, install,
  test_cmd, log_parser, ...) is the install recipe and test command.
- SWE-rebench V2: `install_config.test_cmd` is a list of commands, `log_parser` names one of its
  parsers, the image holds the repository at `/<name>` with no conda.
- SWE-smith: there is no test_patch (the tests are in the repository) and `patch` introduces the
  bug: the gold fix is its reverse; the whole suite runs with SWE-smith's command (its default:
  profiles with `min_testing` run only the graded files there, which a record does not say), its
  verbose-line parser, graded by SWE-bench 4.x's rules.
- SWE-Gym (its repositories, no install_config): the test command of SWE-Gym's harness per repo
  (`-n0` where it has one), its images `xingyaoww/sweb.eval.x86_64.<id>` (`__` -> `_s_`), 4.x rules.

A task names where its repository comes from: its Docker image, a clone in
`$JAXSWE_REPOS_DIR/<owner>__<name>` (local backend, per-task images), `source_dir` (a git
repository; a relative path is taken from the task file's directory, as mining writes it), or the
built-in package data (a materialized git repository).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.errors import TaskError
from envs.tasks import official
from envs.tasks.builtin_repos import BUILTIN_DIR, builtin_source, materialize
from envs.tasks.parsers import PARSERS, STATUSES, parser_name_for_repo
from envs.tasks.patches import patch_files
from envs.tasks.twins import Twin

# sources a build step compiles: a fix to them needs the post-patch reinstall (recipe_problem)
_COMPILED_SUFFIXES = (".pyx", ".pxd", ".pxi", ".c", ".cc", ".cpp", ".cxx", ".h", ".hpp", ".f", ".f90", ".rs")

DEFAULT_TEST_CMD = "pytest -rA"
TESTBED = "/testbed"
CONDA_INIT = "source /opt/miniconda3/bin/activate && conda activate testbed"
FORMATS = ("swe-bench", "swe-rebench", "swe-rebench-v2", "swe-smith", "swe-gym")
SWE_SMITH_TEST_CMD = "pytest --disable-warnings --color=no --tb=no --verbose"  # the whole suite
# SWE-Gym's test command per repository (its harness fork's specs; the same for every version but
# mypy's, whose `-k` names the `[case ...]` blocks of test_patch, with `-n0` before 1.7)
SWE_GYM_TEST_CMDS = {
    "bokeh/bokeh": "pytest -rA -n0",
    "conan-io/conan": "pytest -n0 -rA",
    "dask/dask": "pytest -n0 -rA  --color=no",
    "facebookresearch/hydra": "pytest -rA --tb=long",
    "getmoto/moto": "pytest -n0 -rA",
    "hypothesisworks/hypothesis": "pytest -n0 -rA --tb=no --no-header",
    "iterative/dvc": "pytest -rA",
    "modin-project/modin": "pytest -n0 -rA",
    "pandas-dev/pandas": "pytest -rA --tb=long",
    "project-monai/monai": "pytest -rA ",
    "pydantic/pydantic": "pytest -rA --tb=short -vv -o console_output_style=classic --no-header",
    "python/mypy": "pytest -rA -k",
}
# SWE-rebench V2's parsers that jaxswe runs as V2 does: its pytest ones (jaxswe's or swebench's,
# which differ from V2's only in V2 lacking XFAIL, a status its rules fail like a missing test) and
# those whose code in swebench 4.x is V2's (SWE-rebench-V2 @ c71902a8, lib/agent/log_parsers.py).
# Others of the same name differ (phpunit, gradle_custom, react_pdf strip durations; calypso; p5js)
# or are V2's own: refused rather than graded by different code.
_V2_SAME = """pytest pytest_options pytest_v2 redis marked gotest jq doctest micropython_test googletest
minitest cucumber ruby_unit rspec_transformed_json cargo maven ant chart_js jest jest_json vitest karma tap"""
REBENCH_V2_PARSERS = frozenset("parse_log_" + name for name in _V2_SAME.split())
_REQUIRED = ("instance_id", "repo", "base_commit", "patch", "FAIL_TO_PASS", "PASS_TO_PASS")
_NON_TEST_EXTS = (".json", ".png", "csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml", ".toml")


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
    format: str = "swe-bench"
    workdir: str = TESTBED  # where the task's image holds the repository
    shell_init: str = ""  # run before each command in the task's image (SWE images: conda)
    install: dict[str, Any] = field(default_factory=dict, hash=False)  # the install recipe
    env_commit: str = ""  # environment_setup_commit: the commit the environment is built at
    # each graded test's status under the gold patch, recorded at validation (envs.grading.validate); with
    # it, XFAIL and SKIPPED count as passing only where gold had them (envs.tasks.parsers)
    reference_statuses: dict[str, str] = field(default_factory=dict, hash=False)
    # the validated perturbed twins of its FAIL_TO_PASS tests (envs.tasks.twins); None: not made yet (a
    # paying grade makes and checks them once), (): none could be made or validated
    twins: tuple[Twin, ...] | None = field(default=None, compare=False, hash=False)
    # the fraction of plausible wrong fixes its tests reject (envs.grading.strength; None: not measured or
    # nothing decided) and the wrong fixes they accept, for a reader (never shown to the policy)
    strength: float | None = field(default=None, compare=False, hash=False)
    survivors: tuple[dict[str, str], ...] = field(default=(), compare=False, hash=False)
    source_dir: str | None = field(default=None, compare=False)  # a git repo holding base_commit (built-in)
    raw: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def rules(self) -> str:
        """The grading rules of the task's own harness (envs.tasks.parsers.graded_failures)."""
        return {"swe-rebench": "swebench-4", "swe-smith": "swebench-4", "swe-gym": "swebench-4",
                "swe-rebench-v2": "rebench-v2"}.get(self.format, "swebench-5")  # fmt: skip

    @property
    def test_command(self) -> str:
        return " ".join([self.test_cmd, *self.test_directives])

    @property
    def remote_image(self) -> str | None:
        """The Docker Hub name of the task's published image (SWE-bench: `swebench/...` with `__` ->
        `_1776_`; SWE-Gym: `xingyaoww/sweb.eval.x86_64.<id>`, `__` -> `_s_`, lower case)."""
        if self.format == "swe-gym":
            return f"docker.io/xingyaoww/sweb.eval.x86_64.{self.instance_id}".replace("__", "_s_").lower()
        if self.format != "swe-bench" or self.repo.startswith("builtin/"):
            return None
        return official.instance_image(self.instance_id, namespace="swebench")

    @property
    def requirement_files(self) -> tuple[str, ...]:
        """The recipe's requirement files, in the order tried: `reqs_path`, or for `packages:
        requirements.txt` SWE-bench's paths for the repository, then requirements.txt (the
        official harness installs the first that exists)."""
        paths = self.install.get("reqs_path") or []
        paths = [paths] if isinstance(paths, str) else list(paths)
        if not paths and self.install.get("packages") == "requirements.txt":
            paths = [*official.requirement_paths(self.repo), "requirements.txt"]
        return tuple(paths)

    def recipe_problem(self, python: str, *, local: bool) -> str | None:
        """Why the task's install recipe cannot be built as its harness builds it (None: it can),
        `python` being the X.Y version the environment would get."""
        wanted = str(self.install.get("python") or "")
        if wanted and wanted != python:
            return f"its recipe needs Python {wanted} and the environment would have {python}"
        if self.install.get("packages") == "environment.yml" or self.install.get("env_yml_path"):
            return "its recipe is a conda environment.yml (no conda here)"
        if local and self.install.get("pre_install"):
            return "its recipe has pre_install steps (system commands: the docker backend runs them)"
        if compiled := [f for f in patch_files(self.patch) if f.endswith(_COMPILED_SUFFIXES)]:
            return (
                f"its fix changes compiled-extension source ({compiled[0]}), which takes effect only through "
                "the official harness's post-patch reinstall; jaxswe runs none of a patch's code before the "
                "grader's test process starts (a hostile build script would run outside its checks)"
            )
        return None

    def repos_dir_clone(self, *, missing_ok: bool = False) -> Path | None:
        """`$JAXSWE_REPOS_DIR/<owner>__<name>` if it exists (else None, or the path if missing_ok)."""
        root = Path(os.environ.get("JAXSWE_REPOS_DIR", Path.home() / ".cache" / "jaxswe" / "repos"))
        path = root / self.repo.replace("/", "__")
        return path if missing_ok or path.is_dir() else None

    def to_record(self) -> dict[str, Any]:
        """A record that `load_tasks` reads back into an equal Task (every default made explicit)."""
        record = dict(self.raw)
        for name in ("install_config", "eval_script", "environment_setup_commit", "docker_image"):
            record.pop(name, None)
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
                "format": "jaxswe",
                "source_format": self.format,
                "workdir": self.workdir,
                "shell_init": self.shell_init,
                "install": self.install,
                "env_commit": self.env_commit,
                "reference_statuses": dict(self.reference_statuses),
            }
        )
        if self.twins is not None:
            record["twins"] = [t.to_json() for t in self.twins]
        if self.strength is not None or self.survivors:
            record.update(strength=self.strength, survivors=[dict(s) for s in self.survivors])
        if self.source_dir is not None and not self.repo.startswith("builtin/"):
            record["source_dir"] = self.source_dir
        return record


def _fail(index: int, record: Any, name: str, why: str) -> TaskError:
    iid = record.get("instance_id", "?") if isinstance(record, dict) else "?"
    return TaskError(f"task record {index} (instance_id={iid!r}): field {name!r} {why}")


def _json_field(index: int, record: dict, name: str, value: Any, kinds: tuple[type, ...]) -> Any:
    """A field published as a value or as a JSON string of it."""
    if isinstance(value, str) and str not in kinds:
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise _fail(index, record, name, "is a string that is not valid JSON") from None
    if not isinstance(value, kinds):
        raise _fail(index, record, name, f"must be {' or '.join(k.__name__ for k in kinds)}")
    return value


def _test_list(index: int, record: dict, name: str) -> tuple[str, ...]:
    value = _json_field(index, record, name, record[name], (list,))
    if not all(isinstance(v, str) for v in value):
        raise _fail(index, record, name, "must be a list of test names")
    return tuple(value)


def _test_directives(record: dict, test_patch: str) -> tuple[str, ...]:
    """SWE-bench's convention: run the test files test_patch touches (Django: dotted modules)."""
    if not record["repo"].startswith("builtin/") and official.available():  # importing it costs ~150 MB
        return tuple(official.test_directives({**record, "test_patch": test_patch}))
    files = [f for f in patch_files(test_patch) if not f.endswith(_NON_TEST_EXTS)]
    if record["repo"] == "django/django":
        files = [f.removesuffix(".py").removeprefix("tests/").replace("/", ".") for f in files]
    return tuple(files)


_SWAP_HEADERS = {
    "new file mode": "deleted file mode", "deleted file mode": "new file mode",
    "rename from": "rename to", "rename to": "rename from", "copy from": "copy to", "copy to": "copy from",
    "old mode": "new mode", "new mode": "old mode",
}  # fmt: skip


def _side(name: str, prefix: str) -> str:
    """`a/x` or `b/x` as the other side's name (`/dev/null` stays)."""
    return name if name.startswith("/dev/null") else prefix + name[2:]


def reverse_patch(diff: str) -> str:
    """The reverse of a unified git diff (what `git apply -R` applies), for SWE-smith's fixes."""
    out: list[str] = []
    lines = diff.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        line = lines[i]
        if m := re.match(r"diff --git a/(\S+) b/(\S+)(\s*)$", line):
            out.append(f"diff --git a/{m.group(2)} b/{m.group(1)}{m.group(3)}")
        elif line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            out += [f"--- {_side(lines[i + 1][4:], 'a/')}", f"+++ {_side(line[4:], 'b/')}"]
            i += 1
        elif m := re.match(r"@@ -(\S+) \+(\S+) @@", line):
            out.append(f"@@ -{m.group(2)} +{m.group(1)} @@{line[m.end() :]}")
        elif m := re.match(r"index (\w+)\.\.(\w+)", line):
            out.append(f"index {m.group(2)}..{m.group(1)}{line[m.end() :]}")
        elif key := next((k for k in _SWAP_HEADERS if line.startswith(k + " ")), None):
            out.append(_SWAP_HEADERS[key] + line[len(key) :])
        elif line[:1] in "+-":
            out.append({"+": "-", "-": "+"}[line[0]] + line[1:])
        else:
            out.append(line)
        i += 1
    return "".join(out)


def _detect_format(record: dict, install: dict) -> str:
    declared = record.get("source_format") if record.get("format") == "jaxswe" else record.get("format")
    if declared:
        return declared
    if "swesmith" in str(record.get("image_name", "")).lower():
        return "swe-smith"
    if isinstance(install.get("test_cmd"), list):
        return "swe-rebench-v2"
    gym = record["repo"].lower() in SWE_GYM_TEST_CMDS
    if not install and gym and not official.knows_repo(record["repo"]):
        return "swe-gym"
    return "swe-rebench" if install else "swe-bench"


def _swe_gym_test_cmd(repo: str, version: str, test_patch: str) -> str:
    command = SWE_GYM_TEST_CMDS[repo.lower()]
    if repo.lower() != "python/mypy":
        return command
    if version and tuple(int(x) for x in re.findall(r"\d+", version)[:2]) < (1, 7):
        command = "pytest -n0 -rA -k"
    return command + " " + shlex.quote(" or ".join(re.findall(r"\[case ([^\]]+)\]", test_patch)))


def _str_field(index: int, record: dict, name: str, default: str = "") -> str:
    value = record.get(name, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise _fail(index, record, name, "must be a string")
    return value


def _strength_fields(index: int, record: dict) -> tuple[float | None, tuple[dict[str, str], ...]]:
    """A record's measured test strength (a number in [0, 1] or null) and surviving wrong fixes."""
    strength = record.get("strength")
    if strength is not None and (
        isinstance(strength, bool) or not isinstance(strength, int | float) or not 0 <= strength <= 1
    ):
        raise _fail(index, record, "strength", "must be a number from 0 to 1 or null")
    survivors = record.get("survivors") or []
    if not isinstance(survivors, list) or not all(
        isinstance(s, dict) and all(isinstance(v, str) for v in s.values()) for s in survivors
    ):
        raise _fail(index, record, "survivors", "must be a list of wrong fixes (objects of strings)")
    return strength, tuple(survivors)


def task_from_record(record: Any, index: int = 0, *, source_dir: str | None = None) -> Task:
    """Validate one published record (or one written by `Task.to_record`) into a Task."""
    if not isinstance(record, dict):
        raise TaskError(f"task record {index}: expected a JSON object, got {type(record).__name__}")
    for name in _REQUIRED:
        if name not in record:
            raise _fail(index, record, name, "is missing")
    for name in ("instance_id", "repo", "base_commit", "patch"):
        if not isinstance(record[name], str):
            raise _fail(index, record, name, "must be a string")
    if not record["instance_id"]:
        raise _fail(index, record, "instance_id", "is empty")
    install = record.get("install") if record.get("format") == "jaxswe" else record.get("install_config")
    install = _json_field(index, record, "install_config", install or {}, (dict,))
    fmt = _detect_format(record, install)
    if fmt not in FORMATS:
        raise _fail(index, record, "format", f"names an unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    if fmt != "swe-smith" and "test_patch" not in record:
        raise _fail(index, record, "test_patch", "is missing")
    patch, test_patch = record["patch"], record.get("test_patch") or ""
    if not isinstance(test_patch, str):
        raise _fail(index, record, "test_patch", "must be a string")
    if fmt == "swe-smith" and record.get("format") != "jaxswe":
        patch = reverse_patch(patch)  # SWE-smith's `patch` breaks the code; its reverse fixes it
    version = str(record.get("version") or "")
    test_cmd = record.get("test_cmd") or install.get("test_cmd")
    if isinstance(test_cmd, str) and test_cmd.lstrip().startswith("["):
        test_cmd = _json_field(index, record, "test_cmd", test_cmd, (list,))
    if isinstance(test_cmd, list):
        if not all(isinstance(c, str) for c in test_cmd):
            raise _fail(index, record, "test_cmd", "must be a command or a list of commands")
        test_cmd = " && ".join(test_cmd)
    if test_cmd is None and fmt == "swe-bench":
        spec = official.spec(record["repo"], version)
        if version and not official.available():
            official.require(
                f"task record {index} (instance_id={record['instance_id']!r}) has no test_cmd and"
            )
        if official.knows_repo(record["repo"]) and spec is None:
            raise _fail(index, record, "version", f"{version!r} has no SWE-bench spec for {record['repo']}")
        if spec is not None:
            test_cmd = "; ".join([*spec.get("eval_commands", []), spec["test_cmd"]])
            install = {k: v for k, v in spec.items() if k not in ("test_cmd", "eval_commands")}
    if test_cmd is None and fmt == "swe-gym":
        if record["repo"].lower() not in SWE_GYM_TEST_CMDS:
            raise _fail(index, record, "repo", f"{record['repo']!r} is not one of SWE-Gym's repositories")
        test_cmd = _swe_gym_test_cmd(record["repo"], version, test_patch)
    if test_cmd is None and fmt == "swe-smith":
        test_cmd = SWE_SMITH_TEST_CMD
    test_cmd = DEFAULT_TEST_CMD if test_cmd is None else test_cmd
    if not isinstance(test_cmd, str) or not test_cmd.strip():
        raise _fail(index, record, "test_cmd", "must be a non-empty command")

    parser = record.get("log_parser") or install.get("log_parser")
    parser = parser or ("pytest_verbose" if fmt == "swe-smith" else parser_name_for_repo(record["repo"]))
    if fmt == "swe-rebench-v2" and parser not in REBENCH_V2_PARSERS:
        raise _fail(
            index, record, "log_parser", f"names {parser!r}, a SWE-rebench V2 parser jaxswe cannot run as V2 "
            f"does (it reads: {', '.join(sorted(REBENCH_V2_PARSERS))})",
        )  # fmt: skip
    if not isinstance(parser, str) or parser not in PARSERS:
        hint = "" if official.available() else f"; {official.INSTALL_HINT}"
        raise _fail(index, record, "log_parser", f"names an unknown parser {parser!r}{hint}")
    image = record.get("image_name") or record.get("docker_image") or record.get("image")
    if image is not None and not isinstance(image, str):
        raise _fail(index, record, "image_name", "must be a string")
    if image is None and fmt == "swe-bench" and not record["repo"].startswith("builtin/"):
        image = official.instance_image(record["instance_id"])
    if "test_directives" in record:
        directives = record["test_directives"]
        if not isinstance(directives, list) or not all(isinstance(d, str) for d in directives):
            raise _fail(index, record, "test_directives", "must be a list of strings")
        directives = tuple(directives)
    elif fmt in ("swe-bench", "swe-rebench", "swe-gym") and record["repo"].lower() != "python/mypy":
        directives = _test_directives(record, test_patch)
    else:
        directives = ()  # V2 commands name their tests; SWE-smith runs the whole suite
    default_workdir = "/" + record["repo"].rsplit("/", 1)[-1] if fmt == "swe-rebench-v2" else TESTBED
    default_init = "" if fmt == "swe-rebench-v2" or record["repo"].startswith("builtin/") else CONDA_INIT
    if source_dir is None and not record["repo"].startswith("builtin/"):
        source_dir = _str_field(index, record, "source_dir") or None  # a local repository (mined tasks)
    if source_dir is None and record["repo"].startswith("builtin/"):
        source_dir = builtin_source(record["instance_id"], record["base_commit"], record.get("builtin_dir"))
    fail_to_pass = _test_list(index, record, "FAIL_TO_PASS")
    if not fail_to_pass:
        raise _fail(index, record, "FAIL_TO_PASS", "is empty (a task needs a failing test)")
    reference = _json_field(
        index, record, "reference_statuses", record.get("reference_statuses") or {}, (dict,)
    )
    if not all(isinstance(k, str) and v in STATUSES for k, v in reference.items()):
        raise _fail(
            index, record, "reference_statuses", f"must map test ids to statuses ({', '.join(STATUSES)})"
        )
    twins = record.get("twins")
    if twins is not None:
        try:
            twins = tuple(Twin.from_json(t) for t in _json_field(index, record, "twins", twins, (list,)))
        except (KeyError, TypeError, ValueError) as err:
            raise _fail(
                index, record, "twins", f"must be a list of twins (envs.tasks.twins.Twin): {err}"
            ) from None
    strength, survivors = _strength_fields(index, record)
    return Task(
        instance_id=record["instance_id"],
        repo=record["repo"],
        base_commit=record["base_commit"],
        patch=patch,
        test_patch=test_patch,
        problem_statement=str(record.get("problem_statement", "")),
        fail_to_pass=fail_to_pass,
        pass_to_pass=_test_list(index, record, "PASS_TO_PASS"),
        test_cmd=test_cmd,
        test_directives=directives,
        log_parser=parser,
        image=image,
        version=version,
        format=fmt,
        workdir=_str_field(index, record, "workdir", default_workdir),
        shell_init=_str_field(index, record, "shell_init", default_init),
        install=install,
        env_commit=_str_field(index, record, "env_commit")
        or _str_field(index, record, "environment_setup_commit"),
        reference_statuses=reference,
        twins=twins,
        strength=strength,
        survivors=survivors,
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


def _source_from(record: Any, base: Path) -> Any:
    """The record with a relative `source_dir` (a mined task's repository) taken from `base`, the
    task file's directory."""
    source = record.get("source_dir") if isinstance(record, dict) else None
    if isinstance(source, str) and source and not Path(source).is_absolute():
        return {**record, "source_dir": os.path.normpath(base / source)}
    return record


def load_tasks(path: str | Path) -> list[Task]:
    """Tasks of a .json (a list or one record) / .jsonl file, or `"builtin"` for the built-in suite."""
    if str(path) == "builtin":
        return load_builtin()
    path = Path(path)
    if path.is_dir():
        return load_builtin(path)
    if not path.is_file():
        raise TaskError(f"task file {path} does not exist")
    base = path.resolve().parent
    tasks = [task_from_record(_source_from(r, base), i) for i, r in enumerate(_read_records(path))]
    seen: set[str] = set()
    for i, t in enumerate(tasks):
        if t.instance_id in seen:
            raise TaskError(
                f"task record {i} (instance_id={t.instance_id!r}): field 'instance_id' is duplicated"
            )
        seen.add(t.instance_id)
    return tasks


def _load_one(task_dir: Path, index: int) -> Task:
    spec = task_dir / "task.json"
    try:
        record = json.loads(spec.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise TaskError(f"built-in task {index} ({task_dir.name}): cannot read {spec}: {err}") from None
    if not isinstance(record, dict):
        raise TaskError(f"built-in task {index} ({task_dir.name}): {spec} is not a JSON object")
    repo_dir, commit = materialize(task_dir)
    record = {**record, "base_commit": commit, "builtin_dir": str(task_dir), "test_directives": []}
    record.setdefault("test_cmd", "pytest")
    return task_from_record(record, index, source_dir=str(repo_dir))


def load_builtin(root: str | Path | None = None) -> list[Task]:
    """Every task under `root` (default: the package's built-in suite), sorted by instance_id."""
    root = Path(root) if root is not None else BUILTIN_DIR
    dirs = sorted(p for p in root.iterdir() if (p / "task.json").is_file()) if root.is_dir() else []
    if not dirs:
        raise TaskError(f"no built-in tasks (no */task.json) under {root}")
    return [_load_one(d, i) for i, d in enumerate(dirs)]
