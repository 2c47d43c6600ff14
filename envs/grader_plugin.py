"""The grader's pytest plugin (copied into the sandbox as `jaxswe_grader`, loaded with `-p`).

pytest imports it while parsing its arguments, before any conftest.py, ini-driven plugin or
project module. It writes one JSON line per event to the report file the grader names in
$JAXSWE_GRADER_REPORT (popped from the environment at import): `start`; one `test` line per
setup/call/teardown report, taken from the outermost `pytest_runtest_makereport` wrapper with
the phase's own exception info next to it (a report that says passed while the phase raised is
recorded as a failure); a `collect` line per failed collector; `finish` with the session's final
exit status. With $JAXSWE_GRADER_CWD set (a `python -m pytest` command, run with
PYTHONSAFEPATH=1 so the checkout cannot shadow pytest) it puts the working directory on
sys.path only now, after the runner is imported, as `python -m` would have.
Must import on every Python a task image may have (no 3.10+ syntax).
"""

import json
import os
import sys

import pytest

_report = open(os.environ.pop("JAXSWE_GRADER_REPORT"), "a", buffering=1, encoding="utf-8")  # noqa: SIM115
if os.environ.pop("JAXSWE_GRADER_CWD", ""):
    sys.path.insert(0, os.getcwd())


def _write(record):
    _report.write(json.dumps(record) + "\n")


_write({"event": "start"})


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    raised = call.excinfo is not None and not call.excinfo.errisinstance(pytest.skip.Exception)
    message = "" if report.passed else str(getattr(report, "longreprtext", ""))[-2000:]
    _write({
        "event": "test", "nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
        "xfail": hasattr(report, "wasxfail"), "raised": raised, "message": message,
    })  # fmt: skip


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        _write({"event": "collect", "nodeid": report.nodeid, "message": str(report.longreprtext)[-2000:]})


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    yield
    _write({"event": "finish", "exitstatus": int(session.exitstatus)})
