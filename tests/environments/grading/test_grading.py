"""Grading in fresh local sandboxes: gold/empty, tampering, apply failures, validate, filter, CLI."""

import json
import shutil

import pytest
from helpers import DATA

from envs import filter_tasks, grade, load_tasks, validate_task
from envs.grading.grader import build_test_command, parse_report
from jaxswe.cli import main

BUILTIN = DATA / "builtin_tasks"


@pytest.fixture(scope="module")
def tasks():
    return {t.instance_id: t for t in load_tasks(BUILTIN)}


def _diff(path: str, old: str, new: str, *, new_file: bool = False) -> str:
    """A one-hunk git diff replacing the whole file `path` (old -> new)."""
    old_lines, new_lines = old.splitlines(keepends=True), new.splitlines(keepends=True)
    head = f"diff --git a/{path} b/{path}\n" + (
        "new file mode 100644\n--- /dev/null\n" if new_file else f"--- a/{path}\n"
    )
    hunk = f"@@ -{'0,0' if new_file else f'1,{len(old_lines)}'} +1,{len(new_lines)} @@\n"
    return (
        head
        + f"+++ b/{path}\n"
        + hunk
        + "".join("-" + ln for ln in old_lines)
        + "".join("+" + ln for ln in new_lines)
    )


CALC = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"


@pytest.mark.slow
def test_gold_resolves_and_empty_does_not(tasks):
    for task in tasks.values():
        gold = grade(task, task.patch)
        assert gold.resolved, (gold.reason, gold.log[-2000:])
        assert all(gold.tests[t] == "PASSED" for t in [*task.fail_to_pass, *task.pass_to_pass])
        empty = grade(task, "")
        assert not empty.resolved and "not passing" in empty.reason
        assert all(empty.tests[t] == "PASSED" for t in task.pass_to_pass)


def test_tampering_never_resolves(tasks):
    task = tasks["calc__add"]
    cheat_test = (
        "def test_add():\n    assert True\n\n\nclass TestAdd:\n    def test_negative(self):\n        pass\n"
    )
    conftest = "import pytest\n\n\ndef pytest_collection_modifyitems(items):\n    for i in items:\n        i.add_marker(pytest.mark.skip)\n"  # noqa: E501
    fake = (
        "import atexit, sys\n"
        "print('PASSED tests/test_calc.py::test_add')\n"
        "atexit.register(lambda: sys.stdout.write('=== short test summary info ===\\n'\n"
        "    'PASSED tests/test_calc.py::test_add\\nPASSED tests/test_calc.py::TestAdd::test_negative\\n'\n"
        "    'PASSED tests/test_calc.py::test_sub\\n=== 3 passed ===\\n'))\n" + CALC
    )
    patches = {
        "edits the failing test": _diff("tests/test_calc.py", "", cheat_test, new_file=True),
        "adds a skipping conftest.py": _diff("conftest.py", "", conftest, new_file=True),
        "adds a nested conftest.py": _diff("tests/conftest.py", "", conftest, new_file=True),
        "prints fake PASSED lines": _diff("calc.py", CALC, fake),
    }
    for what, patch in patches.items():
        result = grade(task, patch)
        assert not result.resolved, what
        assert result.tests.get("tests/test_calc.py::test_add") != "PASSED", what
    assert grade(task, patches["adds a skipping conftest.py"]).dropped_paths == ("conftest.py",)
    fake = grade(task, patches["prints fake PASSED lines"])
    assert fake.flags == ("registers an exit hook",) and not fake.tamper, fake.reason  # a flag, not a verdict


def test_exit_code_and_missing_tests(tasks):
    task = tasks["calc__add"]
    fixed = CALC.replace("return a - b", "return a + b", 1)
    # every test passes and the session ends with 0, then the process dies at exit (no atexit/os._exit)
    dies = "import os, weakref\n\n\nclass _K:\n    pass\n\n\n_k = _K()\n"
    dies += "weakref.finalize(_k, os.kill, os.getpid(), 9)\n"
    crash = _diff("calc.py", CALC, dies + fixed)
    result = grade(task, crash)
    # (the session ends with 1: the must-fail canary failed, as it must)
    assert not result.resolved and "exited 137 but its session ended with 1" in result.reason, result.reason
    # the module kills pytest before any report: every graded test is missing
    killer = _diff("calc.py", CALC, "import os\nos.kill(os.getpid(), 9)\n" + fixed)
    result = grade(task, killer)
    assert (
        not result.resolved and result.tests["tests/test_calc.py::test_add"] == "MISSING" and not result.error
    )


def test_patch_that_does_not_apply(tasks):
    task = tasks["calc__add"]
    bad = _diff("calc.py", "something else\n", "x\n")
    result = grade(task, bad)
    assert not result.resolved and result.reason.startswith("patch does not apply") and not result.error
    assert grade(task, "not a diff at all\n").reason.startswith("patch does not apply")


def test_test_command_gets_the_graders_configuration_only_for_plain_pytest(tasks):
    task = tasks["calc__add"]
    command, env = build_test_command(task, "/tmp/g")
    assert (
        command == "pytest -c /tmp/g/pytest.ini --rootdir=. -p no:cacheprovider --maxfail=0 -p jaxswe_grader"
    )
    assert env == {"JAXSWE_GRADER_REPORT": "/tmp/g/report.jsonl"}
    command, env = build_test_command(tasks["words__snake"], "/tmp/g", "pyproject.toml")
    # `python -m pytest` starts through the grader's launcher (sys.path[0] is its directory on any
    # Python); the plugin puts the checkout first on sys.path once pytest is imported, as -m would
    assert command.startswith("python3 /tmp/g/jaxswe_pytest.py ") and "-c pyproject.toml" in command
    assert env["JAXSWE_GRADER_CWD"] == "1"
    other = type(task)(**{**task.__dict__, "test_cmd": "pytest; echo hi"})
    assert build_test_command(other, "/tmp/g") == ("pytest; echo hi", {})
    # the entry-point plugins recorded on the clean base load by name, before the grader's, autoload off
    command, env = build_test_command(task, "/tmp/g", plugins=("asyncio", "pytest_mock"))
    assert command.endswith("--maxfail=0 -p asyncio -p pytest_mock -p jaxswe_grader")
    assert env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] == "1"
    record = '{"event": "plugins", "names": ["asyncio"], "pytest": "%s"}'
    assert parse_report(record % "8.3.1").plugins == ("asyncio",)
    assert parse_report(record % "4.3.1").plugins is None  # no `-p NAME` before pytest 4.4: autoload


@pytest.mark.slow
def test_validate_and_filter(tasks):
    v = validate_task(tasks["calc__add"], runs=2)
    assert v.ok and v.gold_resolved == (True, True) and not v.empty_resolved and not v.flaky, v
    kept, dropped = filter_tasks(tasks.values())
    assert [t.instance_id for t in kept] == ["calc__add"]
    assert "ImportError/AttributeError" in dropped["words__snake"]
    kept, dropped = filter_tasks(tasks.values(), max_files=0, run_tests=False)
    assert kept == [] and all("files" in why for why in dropped.values())


@pytest.mark.slow
def test_flaky_task_is_reported(tmp_path):
    """A test that passes on odd runs only (a counter outside the sandbox) is flaky over 2 runs."""
    src = tmp_path / "flaky__count"
    shutil.copytree(BUILTIN / "calc__add", src)
    record = json.loads((src / "task.json").read_text())
    test = record["test_patch"].replace(
        "+def test_add():\n",
        "+def test_add():\n+    import os, pathlib\n+    p = pathlib.Path(os.environ['FLAKY_COUNTER'])\n"
        "+    n = int(p.read_text() or 0) + 1 if p.exists() else 1\n+    p.write_text(str(n))\n"
        "+    assert n % 2 == 1\n",
    )
    head, rest = test.split("@@ -1,5 +1,14 @@", 1)
    (src / "task.json").write_text(json.dumps({**record, "test_patch": head + "@@ -1,5 +1,19 @@" + rest}))
    task = load_tasks(tmp_path)[0]
    v = validate_task(task, runs=2, isolation="none", env={"FLAKY_COUNTER": str(tmp_path / "n")})
    assert not v.ok and v.flaky and v.flaky_tests == ("tests/test_calc.py::test_add",), v


def _cli(argv: list[str]) -> int:
    try:
        main(argv)
    except SystemExit as done:
        return done.code or 0
    return 0


def test_cli_validate_and_filter(tmp_path, capsys):
    assert _cli(["tasks", "validate", str(BUILTIN), "--workers", "2"]) == 0
    out, err = capsys.readouterr()
    lines = [json.loads(ln) for ln in out.splitlines()]  # JSON alone on stdout; progress and tally on stderr
    assert [(r["instance_id"], r["ok"]) for r in lines] == [("calc__add", True), ("words__snake", True)]
    assert "jaxswe tasks validate 2/2 tasks, valid 2" in err and "\r" not in err, err  # lines, not a bar
    assert "2 tasks: 2 valid, 0 invalid, 0 infrastructure failures" in err, err
    out = tmp_path / "kept.jsonl"
    assert _cli(["tasks", "filter", str(BUILTIN), "--out", str(out), "--no-tests", "--max-lines", "3"]) == 0
    dropped = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert [d["instance_id"] for d in dropped] == ["words__snake"]
    assert [t.instance_id for t in load_tasks(out)] == ["calc__add"]
    (tmp_path / "bad.jsonl").write_text('{"instance_id": "x"}\n')
    assert _cli(["tasks", "validate", str(tmp_path / "bad.jsonl")]) == 2
    assert "record 0 (instance_id='x')" in capsys.readouterr().err
    assert _cli(["tasks", "validate", str(BUILTIN), "--backend", "vm"]) == 2
    # a failing task makes the exit code non-zero
    broken = load_tasks(BUILTIN)[0].to_record() | {"patch": ""}
    (tmp_path / "broken.jsonl").write_text(json.dumps(broken) + "\n")
    assert _cli(["tasks", "validate", str(tmp_path / "broken.jsonl")]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["reason"].startswith("gold patch does not resolve")
    assert "1 task: 0 valid, 1 invalid, 0 infrastructure failures" in err, err


@pytest.mark.slow
def test_upstream_tolerance_for_what_the_gold_patch_changes_and_setup_cfg(tasks, tmp_path):
    """Upstream is the contract: a protected path the task's own gold patch changes is the task's
    code (django/test/, astropy/tests/ in SWE-bench) and is kept; setup.cfg is reset only when its
    [tool:pytest] section changes."""
    import dataclasses

    from test_grading_attacks import _git_diff

    task = tasks["calc__add"]
    helper = _git_diff(task, {"tests/__init__.py": "# what the fix needs\n"}, tmp_path / "a")
    variant = dataclasses.replace(task, patch=task.patch + helper, reference_statuses={})
    kept = grade(variant, variant.patch)
    assert kept.resolved and kept.dropped_paths == (), kept.reason
    assert grade(task, task.patch + helper).dropped_paths == ("tests/__init__.py",)  # gold leaves it
    cfg = _git_diff(task, {"setup.cfg": "[metadata]\nname = calc\n"}, tmp_path / "b")
    with_cfg = grade(task, task.patch + cfg)
    assert with_cfg.resolved and with_cfg.dropped_paths == (), with_cfg.reason
