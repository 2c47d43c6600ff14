"""Verdicts equal to the official harnesses' on real published records and real recorded logs.

tests/data/published/swe_smith_eval holds four evaluation logs SWE-smith's harness recorded, with
the report it wrote (SWE-bench/SWE-smith @ cf2e649d, tests/test_logs/run_evaluation, MIT): three
resolved, one not. Each is graded three ways and all must agree: the recorded report, SWE-bench
4.x's own `get_eval_tests_report` + `get_resolution_status` (the rules SWE-smith, SWE-rebench V1
and SWE-Gym grade with), and jaxswe's parser and rules for the format. The rules each format uses
differ where upstream's differ, shown on the same status maps; SWE-bench 5.x's own functions (its
wheel unpacked apart from the installed 4.x) agree with jaxswe's `swebench-5` rules on those maps
and the logs.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from envs import load_tasks, official
from envs.parsers import PARSERS, graded_failures

DATA = Path(__file__).parent / "data" / "published"
LOGS = sorted((DATA / "swe_smith_eval").iterdir())
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
    (task,) = load_tasks(DATA / "swe_smith_real.json")
    assert task.format == "swe-smith" and task.rules == "swebench-4" and task.log_parser == "pytest_verbose"
    assert task.test_command == "pytest --disable-warnings --color=no --tb=no --verbose"  # the whole suite
    assert task.patch.startswith("diff --git") and task.test_patch == ""
    log, _, f2p, _ = _recorded(DATA / "swe_smith_eval" / task.instance_id)
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
    SWE-smith logs, their verdicts equal jaxswe's `swebench-5` rules."""
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
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "v5")}
    done = subprocess.run([sys.executable, "-c", _V5_SCRIPT], input=json.dumps(maps), env=env,
                          capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    official5 = json.loads(done.stdout)
    assert official5["version"] == SWEBENCH_5.split("==")[1]
    ours = [not graded_failures(f2p, p2p, tests, rules="swebench-5") for f2p, p2p, tests in maps]
    assert ours == official5["resolved"], list(zip(ours, official5["resolved"], maps, strict=True))
    assert ours[len(CASES) :] == [True, True, False, True]  # the logs: three resolved, one not
