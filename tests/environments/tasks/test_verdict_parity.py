"""Verdicts equal to the official harnesses' on real published records and real recorded logs.

tests/data/published/swe_smith_eval holds four evaluation logs SWE-smith's harness recorded, with
the report it wrote (SWE-bench/SWE-smith @ cf2e649d, tests/test_logs/run_evaluation, MIT): three
resolved, one not. Each is graded three ways and all must agree: the recorded report, SWE-bench
4.x's own `get_eval_tests_report` + `get_resolution_status` (the rules SWE-smith, SWE-rebench V1
and SWE-Gym grade with), and jaxswe's parser and rules for the format. The rules each format uses
differ where upstream's differ, shown on the same status maps; SWE-bench 5.x's own functions (its
wheel unpacked apart from the installed 4.x) agree with jaxswe's `swebench-5` rules on those maps
and the logs.

tests/data/published/swe_bench_eval holds 123 runs SWE-bench's harness recorded (100 Verified,
23 Lite dev; SWE-agent/mini-swe-agent pull request 816): each log is graded by the recorded
report, by swebench 4.1's own functions (`get_eval_report` where the instance's real record is
here) and by jaxswe, and all agree, test by test too.
"""

from __future__ import annotations

import functools
import gzip
import json
import re
import tempfile
from pathlib import Path

import pytest
from helpers import DATA

from envs import load_tasks
from envs.tasks import official
from envs.tasks.parsers import PARSERS, graded_failures, parser_name_for_repo, status_of

PUBLISHED = DATA / "published"
LOGS = sorted((PUBLISHED / "swe_smith_eval").iterdir())
needs_swebench = pytest.mark.skipif(not official.available(), reason="the swebench extra is not installed")

CASES = [  # (FAIL_TO_PASS, PASS_TO_PASS, statuses, resolved under swebench-5, under rebench-v2)
    (["a"], ["b"], {"a": "PASSED", "b": "PASSED"}, True, True),
    (["a", "c"], ["b"], {"a": "PASSED", "c": "SKIPPED", "b": "PASSED"}, False, False),  # 4.x: dropped
    (["a"], ["b"], {"a": "SKIPPED", "b": "PASSED"}, False, False),  # 4.x: every F2P skipped resolves
    (["a"], ["b"], {"a": "PASSED", "b": "SKIPPED"}, True, False),
    (["a"], ["b"], {"a": "XFAIL", "b": "PASSED"}, True, False),  # V2 has no XFAIL
    (["a"], ["b"], {"a": "PASSED", "b": "PASSED", "x": "PASSED"}, True, False),  # V2: set equality
    (["a"], ["b"], {"a": "PASSED"}, False, False),  # missing fails everywhere
    (["t[a"], [], {"t[a b]": "PASSED", "t[a c]": "FAILED"}, False, False),  # 4.x: the last wins
    (["t[a"], [], {"t[a c]": "FAILED", "t[a b]": "PASSED"}, False, False),
]


def _recorded(run: Path) -> tuple[str, dict, list[str], list[str]]:
    report = json.loads((run / "report.json").read_text())
    status = report["tests_status"]
    f2p = status["FAIL_TO_PASS"]["success"] + status["FAIL_TO_PASS"]["failure"]
    p2p = status["PASS_TO_PASS"]["success"] + status["PASS_TO_PASS"]["failure"]
    return gzip.decompress((run / "test_output.txt.gz").read_bytes()).decode(), report, f2p, p2p


def _between_markers(log: str) -> str:
    """The test output, as SWE-smith reads it (between its start and end markers)."""
    return log.split(">>>>> Start Test Output", 1)[1].split(">>>>> End Test Output", 1)[0]


@needs_swebench
@pytest.mark.parametrize("run", LOGS, ids=[r.name for r in LOGS])
def test_swe_smith_recorded_logs_get_the_official_verdict(run):
    from swebench.harness.constants import ResolvedStatus
    from swebench.harness.grading import get_eval_tests_report, get_resolution_status

    log, report, f2p, p2p = _recorded(run)
    tests, _ = PARSERS["pytest_verbose"](_between_markers(log))
    official_report = get_eval_tests_report(tests, {"FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p})
    official_resolved = get_resolution_status(official_report) == ResolvedStatus.FULL.value
    ours = not graded_failures(f2p, p2p, tests, rules="swebench-4")
    assert ours == official_resolved == report["resolved"], run.name
    for kind in ("FAIL_TO_PASS", "PASS_TO_PASS"):  # test by test, too
        assert official_report[kind] == report["tests_status"][kind], (run.name, kind)


def test_the_real_swe_smith_record_loads_with_its_harness_settings():
    (task,) = load_tasks(PUBLISHED / "swe_smith_real.json")
    assert task.format == "swe-smith" and task.rules == "swebench-4" and task.log_parser == "pytest_verbose"
    assert task.test_command == "pytest --disable-warnings --color=no --tb=no --verbose"  # the whole suite
    assert task.patch.startswith("diff --git") and task.test_patch == ""
    log, _, f2p, _ = _recorded(PUBLISHED / "swe_smith_eval" / task.instance_id)
    tests, _ = PARSERS[task.log_parser](_between_markers(log))
    assert set(task.fail_to_pass) == set(f2p) and all(tests[t] == "PASSED" for t in task.fail_to_pass)


@needs_swebench
def test_each_format_is_graded_by_its_own_harness_rules():
    """Where upstream's rules differ, so do the formats' (same status maps)."""
    from swebench.harness.constants import ResolvedStatus
    from swebench.harness.grading import get_eval_tests_report, get_resolution_status

    def v4(f2p, p2p, tests):
        rep = get_eval_tests_report(tests, {"FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p})
        return get_resolution_status(rep) == ResolvedStatus.FULL.value

    for f2p, p2p, tests, five, rebench_v2 in CASES:
        collapsed = {}
        for k, s in tests.items():  # what 4.x's parsers report: ids cut at the space, the last line kept
            collapsed[k.split(" ")[0]] = s
        assert (not graded_failures(f2p, p2p, tests, rules="swebench-4")) == v4(f2p, p2p, collapsed), tests
        assert (not graded_failures(f2p, p2p, tests, rules="swebench-5")) == five, tests
        assert (not graded_failures(f2p, p2p, tests, rules="rebench-v2")) == rebench_v2, tests


# -- SWE-bench runs recorded by its harness (tests/data/published/SOURCES.md) ----------------------
RUNS = sorted((PUBLISHED / "swe_bench_eval").glob("*/*"))
RECORDS = ("swe_bench_verified_real.jsonl", "swe_bench_lite_real.json", "swe_bench_dev_real.json")


def _swe_bench_run(run: Path) -> tuple[dict, str, list[str], list[str]]:
    """(the recorded report, the test output between the harness's markers, F2P, P2P as the
    report lists them; a skipped test is in neither of 4.x's lists)."""
    (report,) = json.loads((run / "report.json").read_text()).values()
    log = gzip.decompress((run / "test_output.txt.gz").read_bytes()).decode()
    body = log.split(">>>>> Start Test Output", 1)[1].split(">>>>> End Test Output", 1)[0]
    status = report["tests_status"]
    f2p = status["FAIL_TO_PASS"]["success"] + status["FAIL_TO_PASS"]["failure"]
    p2p = status["PASS_TO_PASS"]["success"] + status["PASS_TO_PASS"]["failure"]
    return report, body, f2p, p2p


@functools.cache
def _real_tasks() -> dict:
    return {t.instance_id: t for name in RECORDS for t in load_tasks(PUBLISHED / name)}


def _sorted_lists(status: dict) -> dict:
    return {
        k: {s: sorted(status[k][s]) for s in ("success", "failure")} for k in ("FAIL_TO_PASS", "PASS_TO_PASS")
    }


@needs_swebench
@pytest.mark.parametrize("run", RUNS, ids=[f"{r.parent.name}/{r.name}" for r in RUNS])
def test_swe_bench_recorded_runs_get_the_official_verdict(run):
    """Recorded report == swebench 4.1's grading of the recorded log == jaxswe's, per test too.
    With the instance's record here: `get_eval_report` on the log file with the record's lists,
    and jaxswe grades the loaded task (its parser and rules); the eval script the harness ran
    holds the task's test command. Otherwise: swebench's parser for the repository and
    `get_eval_tests_report` with the report's lists, and jaxswe grades as a SWE-bench task."""
    from swebench.harness.constants import ResolvedStatus
    from swebench.harness.grading import get_eval_report, get_eval_tests_report, get_resolution_status
    from swebench.harness.test_spec.test_spec import TestSpec

    report, body, f2p, p2p = _swe_bench_run(run)
    task = _real_tasks().get(run.name)
    if task is not None:
        spec = TestSpec(
            instance_id=task.instance_id, repo=task.repo, version=task.version, repo_script_list=[],
            eval_script_list=[], env_script_list=[], arch="x86_64", FAIL_TO_PASS=list(task.fail_to_pass),
            PASS_TO_PASS=list(task.pass_to_pass), language="py", docker_specs={}, namespace=None,
        )  # fmt: skip
        prediction = {"instance_id": task.instance_id, "model_patch": "recorded", "model_name_or_path": "m"}
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "log").write_bytes(gzip.decompress((run / "test_output.txt.gz").read_bytes()))
            theirs = get_eval_report(spec, prediction, str(Path(tmp) / "log"), True)[task.instance_id]
        official_resolved, official_status = theirs["resolved"], theirs["tests_status"]
        f2p, p2p, parser, rules = task.fail_to_pass, task.pass_to_pass, task.log_parser, task.rules
        from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS
        from swebench.harness.test_spec.python import make_eval_script_list_py

        specs = MAP_REPO_VERSION_TO_SPECS[task.repo][task.version]
        lines = make_eval_script_list_py(
            task.raw, specs, "testbed", "/testbed", task.base_commit, task.test_patch
        )
        assert (run / "eval.sh").read_text() == "\n".join(["#!/bin/bash", "set -uxo pipefail", *lines]) + "\n"
        eval_sh = (run / "eval.sh").read_text().splitlines()
        assert task.test_command.split("; ")[-1] == eval_sh[eval_sh.index(": '>>>>> Start Test Output'") + 1]
    else:
        repo = run.name.rsplit("-", 1)[0].replace("__", "/")
        official_status = get_eval_tests_report(
            official.parser(repo=repo)(body), {"FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p}
        )
        official_resolved = get_resolution_status(official_status) == ResolvedStatus.FULL.value
        parser, rules = parser_name_for_repo(repo), "swebench-5"
    tests, _ = PARSERS[parser](body)
    ours = not graded_failures(f2p, p2p, tests, rules=rules)
    assert ours == official_resolved == report["resolved"], graded_failures(f2p, p2p, tests, rules=rules)
    assert _sorted_lists(official_status) == _sorted_lists(report["tests_status"])
    passed = {t for k in ("FAIL_TO_PASS", "PASS_TO_PASS") for t in official_status[k]["success"]}
    failed = {t for k in ("FAIL_TO_PASS", "PASS_TO_PASS") for t in official_status[k]["failure"]}
    for test in f2p + p2p:  # test by test: jaxswe's status passes where 4.x's lists say it passed
        if test in passed | failed:
            assert (status_of(test, tests, "swebench-4") in ("PASSED", "XFAIL")) == (test in passed), test


@needs_swebench
def test_jaxswe_parsers_read_the_recorded_swe_bench_logs_as_swebench_does():
    """Over every test id of the recorded logs, jaxswe's own parsers (pytest, Django) and the
    official ones agree, but for the deliberate difference: 4.x reports `SKIPPED [1] file:line`
    as a test named `[1]`."""
    seen = differ = 0
    for run in RUNS:
        repo = run.name.rsplit("-", 1)[0].replace("__", "/")
        _, body, _, _ = _swe_bench_run(run)
        theirs, ours = official.parser(repo=repo)(body), PARSERS[parser_name_for_repo(repo)](body)[0]
        diff = {
            k: (theirs.get(k), ours.get(k)) for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k)
        }
        assert all(re.fullmatch(r"\[\d+\]", k) and v == ("SKIPPED", None) for k, v in diff.items()), (
            run,
            diff,
        )
        seen, differ = seen + len(set(theirs) | set(ours)), differ + len(diff)
    assert (len(RUNS), seen, differ) == (123, 7979, 1)


SWEBENCH_5 = "swebench==5.0.2"
_V5_SCRIPT = """
import json, sys
from swebench import __version__
from swebench.harness.constants import ResolvedStatus
from swebench.harness.grading import get_eval_tests_report, get_resolution_status

out = []
for f2p, p2p, tests in json.load(sys.stdin):
    report = get_eval_tests_report(tests, {"FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p})
    out.append(get_resolution_status(report) == ResolvedStatus.FULL.value)
print(json.dumps({"version": __version__, "resolved": out}))
"""


def test_swebench_5_own_functions_agree_with_the_swebench_5_rules(tmp_path):
    """swebench 5.x cannot be installed beside the 4.x the extra pins (one package name), so its
    wheel is unpacked into a directory of its own and its `get_eval_tests_report` +
    `get_resolution_status` run in a subprocess: on the status maps above and on the recorded
    SWE-smith logs and the recorded SWE-bench runs, their verdicts equal jaxswe's `swebench-5`
    rules."""
    import os
    import subprocess
    import sys
    import zipfile

    got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", SWEBENCH_5, "-d",
                          str(tmp_path)], capture_output=True, text=True, timeout=300)  # fmt: skip
    wheels = list(tmp_path.glob("swebench-*.whl"))
    if got.returncode != 0 or not wheels:
        if os.environ.get("CI") == "true":  # CI reaches PyPI
            pytest.fail(f"pip download {SWEBENCH_5} failed: {got.stderr[-500:]}")
        pytest.skip(f"pip download {SWEBENCH_5} failed (no package index reachable?)")
    zipfile.ZipFile(wheels[0]).extractall(tmp_path / "v5")
    maps = [(f2p, p2p, tests) for f2p, p2p, tests, _, _ in CASES]
    for run in LOGS:
        log, _, f2p, p2p = _recorded(run)
        maps.append((f2p, p2p, PARSERS["pytest_verbose"](_between_markers(log))[0]))
    recorded = []
    for run in RUNS:  # the recorded SWE-bench runs, with the parser jaxswe grades them with
        report, body, f2p, p2p = _swe_bench_run(run)
        repo = run.name.rsplit("-", 1)[0].replace("__", "/")
        maps.append((f2p, p2p, PARSERS[parser_name_for_repo(repo)](body)[0]))
        recorded.append(report["resolved"])
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "v5")}
    done = subprocess.run([sys.executable, "-c", _V5_SCRIPT], input=json.dumps(maps), env=env,
                          capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    official5 = json.loads(done.stdout)
    assert official5["version"] == SWEBENCH_5.split("==")[1]
    ours = [not graded_failures(f2p, p2p, tests, rules="swebench-5") for f2p, p2p, tests in maps]
    assert ours == official5["resolved"], list(zip(ours, official5["resolved"], maps, strict=True))
    smith = len(CASES) + len(LOGS)
    assert ours[len(CASES) : smith] == [True, True, False, True]  # SWE-smith's: three resolved, one not
    assert ours[smith:] == recorded  # and SWE-bench's runs as their reports say
