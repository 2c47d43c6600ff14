"""Task records, built-in loader, patch filtering, log parsers, output cutting (no sandboxes)."""

import json
import subprocess

import pytest
from helpers import DATA

from envs import Task, TaskError, load_tasks
from envs.sandbox.protocol import OutputBuffer
from envs.tasks.builtin_repos import materialize
from envs.tasks.parsers import parse_django, parse_junit_xml, parse_pytest
from envs.tasks.patches import (
    PatchError,
    changed_lines,
    check_git_sections,
    is_protected,
    is_test_path,
    patch_files,
)

BUILTIN = DATA / "builtin_tasks"


def _record(**over):
    rec = {
        "instance_id": "octo__lib-1",
        "repo": "octo/lib",
        "base_commit": "a" * 40,
        "patch": "diff --git a/lib/x.py b/lib/x.py\n--- a/lib/x.py\n+++ b/lib/x.py\n@@ -1 +1 @@\n-a\n+b\n",
        "test_patch": "diff --git a/tests/test_x.py b/tests/test_x.py\n--- a/tests/test_x.py\n+++ b/tests/test_x.py\n"  # noqa: E501
        "@@ -1 +1 @@\n-a\n+b\n",
        "problem_statement": "fix x",
        "FAIL_TO_PASS": '["tests/test_x.py::test_a"]',
        "PASS_TO_PASS": [],
    }
    rec.update(over)
    return rec


def test_swe_records_json_and_jsonl(tmp_path):
    recs = [
        _record(),
        _record(
            instance_id="octo__lib-2",
            install_config={"test_cmd": "pytest --no-header -rA", "log_parser": "parse_log_pytest"},
            docker_image="swerebench/sweb.eval.x86_64.octo_1776_lib-2",
        ),
    ]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (tmp_path / "t.json").write_text(json.dumps(recs))
    for name in ("t.jsonl", "t.json"):
        a, b = load_tasks(tmp_path / name)
        assert a.fail_to_pass == ("tests/test_x.py::test_a",) and a.pass_to_pass == ()
        assert a.test_cmd == "pytest -rA" and a.test_directives == ("tests/test_x.py",)
        assert a.test_command == "pytest -rA tests/test_x.py"
        assert b.test_cmd == "pytest --no-header -rA" and b.log_parser == "parse_log_pytest"
        assert b.image == "swerebench/sweb.eval.x86_64.octo_1776_lib-2"
    # round trip through to_record
    (tmp_path / "rt.jsonl").write_text(
        "".join(json.dumps(t.to_record()) + "\n" for t in load_tasks(tmp_path / "t.json"))
    )
    assert load_tasks(tmp_path / "rt.jsonl") == load_tasks(tmp_path / "t.json")


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"base_commit": None}, "base_commit"),
        ({"FAIL_TO_PASS": "not json"}, "FAIL_TO_PASS"),
        ({"FAIL_TO_PASS": []}, "FAIL_TO_PASS"),
        ({"PASS_TO_PASS": [1, 2]}, "PASS_TO_PASS"),
        ({"log_parser": "nope"}, "log_parser"),
        ({"install_config": "{bad"}, "install_config"),
        ({"test_cmd": "  "}, "test_cmd"),
    ],
)
def test_bad_record_names_index_id_and_field(tmp_path, over, field):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(_record(instance_id="ok-0")) + "\n" + json.dumps(_record(**over)) + "\n")
    with pytest.raises(TaskError) as err:
        load_tasks(path)
    msg = str(err.value)
    assert "record 1" in msg and "octo__lib-1" in msg and repr(field) in msg


def test_missing_field_duplicate_id_and_missing_file(tmp_path):
    rec = _record()
    del rec["test_patch"]
    (tmp_path / "a.json").write_text(json.dumps([rec]))
    with pytest.raises(TaskError, match="record 0 .*'test_patch' is missing"):
        load_tasks(tmp_path / "a.json")
    (tmp_path / "b.json").write_text(json.dumps([_record(), _record()]))
    with pytest.raises(TaskError, match="record 1 .*duplicated"):
        load_tasks(tmp_path / "b.json")
    with pytest.raises(TaskError, match="does not exist"):
        load_tasks(tmp_path / "c.json")


def test_builtin_loader_deterministic_commit(tmp_path, monkeypatch):
    tasks = load_tasks(BUILTIN)
    assert [t.instance_id for t in tasks] == ["calc__add", "words__snake"]
    first = tasks[0].base_commit
    # a different cache directory re-materializes the repository: same hash (fixed author/dates/config)
    monkeypatch.setenv("JAXSWE_CACHE_DIR", str(tmp_path / "cache"))
    repo, commit = materialize(BUILTIN / "calc__add")
    assert commit == first and len(commit) == 40
    log = subprocess.run(
        ["git", "-C", str(repo), "log", "--format=%an %ae %ad"], capture_output=True, text=True
    )
    assert log.stdout.strip().startswith("jaxswe jaxswe@localhost")
    assert len(log.stdout.strip().splitlines()) == 1
    # a record written back out round-trips (source resolved from builtin_dir)
    (tmp_path / "b.jsonl").write_text(json.dumps(tasks[0].to_record()) + "\n")
    assert load_tasks(tmp_path / "b.jsonl")[0] == tasks[0]


def test_builtin_record_with_wrong_commit(tmp_path):
    rec = load_tasks(BUILTIN)[0].to_record() | {"base_commit": "b" * 40}
    (tmp_path / "x.json").write_text(json.dumps(rec))
    with pytest.raises(TaskError, match="base_commit"):
        load_tasks(tmp_path / "x.json")


def test_frozen_task():
    t = load_tasks(BUILTIN)[0]
    assert isinstance(t, Task)
    with pytest.raises(AttributeError):
        t.patch = ""  # type: ignore[misc]


GIT_DIFF = """\
diff --git a/src/pkg/core.py b/src/pkg/core.py
--- a/src/pkg/core.py
+++ b/src/pkg/core.py
@@ -1 +1 @@
-x = 1
+x = 2
diff --git a/tests/test_core.py b/tests/test_core.py
--- a/tests/test_core.py
+++ b/tests/test_core.py
@@ -1 +1 @@
-assert False
+assert True
diff --git a/conftest.py b/conftest.py
new file mode 100644
--- /dev/null
+++ b/conftest.py
@@ -0,0 +1 @@
+import pytest
diff --git a/pkg/check_test.py b/pkg/check_test.py
--- a/pkg/check_test.py
+++ b/pkg/check_test.py
@@ -1 +1 @@
-a
+b
diff --git a/docs/latest.md b/docs/latest.md
--- a/docs/latest.md
+++ b/docs/latest.md
@@ -1 +1 @@
-a
+b
"""


def test_patch_files_come_from_git():
    files = patch_files(GIT_DIFF)
    assert files == [
        "src/pkg/core.py",
        "tests/test_core.py",
        "conftest.py",
        "pkg/check_test.py",
        "docs/latest.md",
    ]
    assert [f for f in files if is_protected(f, ["docs/latest.md"])] == files[1:]
    assert changed_lines(GIT_DIFF) == 9
    plain = "--- a/m.py\t2020\n+++ b/m.py\n@@ -1 +1 @@\n-a\n+b\n"
    assert patch_files(plain) == ["m.py"]
    with pytest.raises(PatchError, match="git header"):
        check_git_sections(plain)
    assert check_git_sections(GIT_DIFF) == files


@pytest.mark.parametrize(
    ("path", "new", "protected"),
    [
        ("pkg/tox.ini", False, True),
        ("setup.cfg", False, False),  # only its [tool:pytest] section is checked (by the grader)
        (".pytest.ini", True, True),
        ("a/b.pth", False, True),
        ("sitecustomize.py", True, True),
        ("evil.dist-info/entry_points.txt", True, True),  # distribution metadata: a plugin entry point
        ("src/Pkg.EGG-INFO/entry_points.txt", False, True),
        ("pytest.py", True, True),
        ("pytest/__main__.py", True, True),
        ("src/_pytest/runner.py", False, False),  # pytest's own repository changes its own code
        ("src/_pytest/new.py", True, True),
        ("pkg/__pycache__/m.cpython-311.pyc", True, True),
        ("pkg/fast.so", True, True),
        ("pyproject.toml", False, False),  # only its pytest tables are checked (by the grader)
        ("pkg/core.py", True, False),
    ],
)
def test_is_protected(path, new, protected):
    assert is_protected(path, new=new) is protected


@pytest.mark.parametrize(
    ("path", "is_test"),
    [
        ("tests/a.py", True),
        ("test/data.json", True),
        ("testing/x.py", True),
        ("django/test/utils.py", False),  # a package's test/ and testing/ are library code (upstream)
        ("sympy/testing/runtests.py", False),
        ("astropy/tests/helper.py", True),  # unless the task's gold patch changes it (envs.grading.grader)
        ("test_a.py", True),
        ("pkg/a_test.py", True),
        ("deep/conftest.py", True),
        ("pkg/testsuite.py", False),
        ("pkg/latest.py", False),
        ("tests.py", False),
    ],
)
def test_is_test_path(path, is_test):
    assert is_test_path(path) is is_test


PYTEST_LOG = """\
PASSED tests/test_a.py::test_fake_from_captured_output
============================= short test summary info ==============================
PASSED tests/test_a.py::test_one
PASSED tests/test_a.py::TestK::test_p[a-b]
FAILED tests/test_a.py::test_two - AssertionError: boom
ERROR tests/test_b.py::test_three - ImportError: no
SKIPPED [1] tests/test_a.py:9: nope
XFAIL tests/test_a.py::test_x - reason
========================= 1 failed, 2 passed in 0.12s ==========================
PASSED tests/test_a.py::test_two
"""


def test_parse_pytest_reads_only_the_summary_section():
    tests, messages = parse_pytest(PYTEST_LOG)
    assert tests == {
        "tests/test_a.py::test_one": "PASSED",
        "tests/test_a.py::TestK::test_p[a-b]": "PASSED",
        "tests/test_a.py::test_two": "FAILED",
        "tests/test_b.py::test_three": "ERROR",
        "tests/test_a.py::test_x": "XFAIL",
    }
    assert "tests/test_a.py::test_fake_from_captured_output" not in tests
    assert tests["tests/test_a.py::test_two"] == "FAILED"  # the line after the summary is ignored
    assert messages["tests/test_b.py::test_three"] == "ImportError: no"
    assert parse_pytest("no summary here\nPASSED x::y\n") == ({}, {})


def test_parse_junit_xunit1_node_ids():
    xml = """<?xml version="1.0"?><testsuites><testsuite name="pytest">
    <testcase classname="tests.test_a" name="test_one" file="tests/test_a.py" line="1"/>
    <testcase classname="tests.test_a.TestK" name="test_p[x.y]" file="tests/test_a.py" line="3"/>
    <testcase classname="tests.test_a" name="test_two" file="tests/test_a.py"><failure message="AttributeError: q">tb</failure></testcase>
    <testcase classname="tests.test_a" name="test_x" file="tests/test_a.py"><skipped type="pytest.xfail" message=""/></testcase>
    <testcase classname="tests.test_a" name="test_s" file="tests/test_a.py"><skipped type="pytest.skip" message=""/></testcase>
    <testcase classname="tests.test_a" name="test_one" file="tests/test_a.py"><error message="teardown"/></testcase>
    </testsuite></testsuites>"""  # noqa: E501
    tests, messages = parse_junit_xml(xml)
    assert tests == {
        "tests/test_a.py::test_one": "ERROR",  # passed, then errored in teardown: the worse one counts
        "tests/test_a.py::TestK::test_p[x.y]": "PASSED",
        "tests/test_a.py::test_two": "FAILED",
        "tests/test_a.py::test_x": "XFAIL",
        "tests/test_a.py::test_s": "SKIPPED",
    }
    assert messages["tests/test_a.py::test_two"].startswith("AttributeError: q")


def test_parse_django():
    log = "test_a (app.tests.T) ... ok\ntest_b (app.tests.T)\nDocstring ... FAIL\ntest_c (app.tests.T) ... ERROR\n"  # noqa: E501
    # a test with a docstring is named by it, as SWE-bench's parse_log_django names it
    assert parse_django(log)[0] == {
        "test_a (app.tests.T)": "PASSED",
        "Docstring": "FAILED",
        "test_c (app.tests.T)": "ERROR",
    }


def test_output_buffer_cuts_head_and_tail():
    buf = OutputBuffer(10)
    for chunk in (b"0123", b"456789abcdef", b"XYZ"):
        buf.add(chunk)
    text = buf.text()
    assert (
        text.startswith("01234\n")
        and text.endswith("\nefXYZ")
        and "9 bytes of output cut; 19 in total" in text
    )
    small = OutputBuffer(100)
    small.add("héllo".encode())
    assert small.text() == "héllo"
