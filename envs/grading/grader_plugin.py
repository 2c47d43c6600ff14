"""The grader's pytest plugin (copied into the sandbox as `jaxswe_grader`, loaded with `-p`).

pytest imports it while parsing its arguments: after pytest itself and pluggy, before the task
environment's entry-point plugins (pytest-mock, pytest-asyncio, ...), any conftest.py or project
module. The grader starts the run with only its private directory on PYTHONPATH; this plugin then
puts the task environment's own import path ($JAXSWE_GRADER_PATH, the sandbox's PYTHONPATH) where
PYTHONPATH would have put it, and, for a `python -m pytest` command (started through the grader's
launcher, whose sys.path[0] is the private directory on every Python), the working directory first,
as `python -m` would have. So the checkout is never on sys.path while pytest imports its own modules.
PYTHONPATH itself goes back to the task environment's, for the processes the tests start.

It writes one JSON line per event to the report file the grader names in $JAXSWE_GRADER_REPORT
(popped from the environment at import): `start`; one `test` line per setup/call/teardown report,
from the outermost `pytest_runtest_makereport` wrapper, with the phase's own exception info next to
it (a report that says passed while the phase raised is recorded as a failure); a `collect` line
per failed collector; `finish` with the session's exit status; `plugins` at configure time: the
entry-point plugins pytest loaded (their entry-point names) and pytest's version, which the grader
records on the clean base (envs.grading.grader) and loads by name in the graded run, autoload off. A
failure's message is its last 1000 characters, so the report stays small.
$JAXSWE_GRADER_TEST_TIMEOUT (seconds) fails a test whose call phase runs longer (SIGALRM).

Everything here runs inside the test process, next to the patch's code, so all of it is forgeable:
the grader trusts it only as far as its canary tests come back as expected (envs.grading.canaries).
Must import on every Python a task image may have (no 3.8+ syntax).
"""

import json
import os
import signal
import sys
import threading

import pytest

_report = open(os.environ.pop("JAXSWE_GRADER_REPORT"), "a", buffering=1, encoding="utf-8")  # noqa: SIM115
_timeout = float(os.environ.pop("JAXSWE_GRADER_TEST_TIMEOUT", "0") or 0)


def _task_path():
    """Put the task's own import path on sys.path (see the module docstring), and give the tests'
    own child processes (`python -m package` in a test) the task environment's PYTHONPATH."""
    here = os.path.dirname(os.path.abspath(__file__))
    task_path = os.environ.pop("JAXSWE_GRADER_PATH", "")
    entries = [os.path.abspath(p or os.curdir) for p in task_path.split(":")]
    at = next((i + 1 for i, p in enumerate(sys.path) if p and os.path.abspath(p) == here), len(sys.path))
    sys.path[at:at] = [p for p in entries if p not in sys.path]
    if task_path:
        os.environ["PYTHONPATH"] = task_path
    else:
        os.environ.pop("PYTHONPATH", None)
    if os.environ.pop("JAXSWE_GRADER_CWD", ""):
        sys.path.insert(0, os.getcwd())


_task_path()


def _write(record):
    _report.write(json.dumps(record) + "\n")


_write({"event": "start"})


class _Hung(Exception):
    pass


def _alarm(signum, frame):
    raise _Hung("the test ran longer than the grader's per-test timeout ({} s)".format(_timeout))  # noqa: UP032


def pytest_configure(config):
    manager = config.pluginmanager
    listed = getattr(manager, "list_plugin_distinfo", lambda: [])()
    names = sorted(set(manager.get_name(plugin) for plugin, _ in listed) - set([None]))
    _write({"event": "plugins", "names": names, "pytest": pytest.__version__})


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_call(item):
    armed = (
        _timeout > 0 and hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()
    )
    if armed:
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, _timeout)
    try:
        yield
    finally:
        if armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    raised = call.excinfo is not None and not call.excinfo.errisinstance(pytest.skip.Exception)
    _write({
        "event": "test", "nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
        "xfail": hasattr(report, "wasxfail"), "raised": raised,
        "message": "" if report.passed else str(getattr(report, "longreprtext", ""))[-1000:],
    })  # fmt: skip


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        _write({"event": "collect", "nodeid": report.nodeid, "message": str(report.longreprtext)[-1000:]})


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    yield
    _write({"event": "finish", "exitstatus": int(session.exitstatus)})
