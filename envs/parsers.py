"""Test-log parsers: test id -> status, from a junit-xml report or a named log format.

Statuses: PASSED, FAILED, ERROR, SKIPPED, XFAIL (an expected failure counts as passing, as in
SWE-bench). Text parsers read only the part of a log a test run writes itself where they can
(pytest: the last `short test summary info` section), so lines an agent's code prints elsewhere
are not read; grading prefers the junit-xml report when the test command is pytest.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Callable

PASSED, FAILED, ERROR, SKIPPED, XFAIL = "PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL"
PASSING = frozenset({PASSED, XFAIL})
_RANK = {PASSED: 0, XFAIL: 0, SKIPPED: 1, FAILED: 2, ERROR: 3}

Parsed = tuple[dict[str, str], dict[str, str]]  # (status per test, failure message per test)


def _record(tests: dict[str, str], name: str, status: str) -> None:
    """Keep the worst status of a test reported twice (e.g. passed, then errored in teardown)."""
    if name not in tests or _RANK[status] > _RANK[tests[name]]:
        tests[name] = status


_SUMMARY_RE = re.compile(r"^=+ short test summary info =+$")
_SUMMARY_LINE_RE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED) (\S.*?)(?: - (.*))?$")


def parse_pytest(log: str) -> Parsed:
    """`pytest -rA`: only the lines of the LAST `short test summary info` section."""
    lines = log.splitlines()
    starts = [i for i, ln in enumerate(lines) if _SUMMARY_RE.match(ln.strip())]
    tests: dict[str, str] = {}
    messages: dict[str, str] = {}
    if not starts:
        return tests, messages
    for line in lines[starts[-1] + 1 :]:
        if line.startswith("="):
            break
        m = _SUMMARY_LINE_RE.match(line.strip())
        if not m or m.group(1) == SKIPPED and m.group(2).startswith("["):
            continue
        status = PASSED if m.group(1) == "XPASS" else m.group(1)
        _record(tests, m.group(2), status)
        if m.group(3):
            messages[m.group(2)] = m.group(3)
    return tests, messages


_DJANGO_RE = re.compile(r"^(\w+ \([\w.]+\))(?: \S.*?)? \.\.\. (ok|OK|FAIL|ERROR|skipped.*|expected failure)$")


def parse_django(log: str) -> Parsed:
    """Django's runtests.py with verbosity 2: `test_x (module.Class) ... ok`."""
    tests: dict[str, str] = {}
    for line in log.splitlines():
        m = _DJANGO_RE.match(line.strip())
        if m:
            word = m.group(2).lower()
            status = {"ok": PASSED, "fail": FAILED, "error": ERROR, "expected failure": XFAIL}.get(
                word, SKIPPED
            )
            _record(tests, m.group(1), status)
    return tests, {}


def parse_junit_xml(xml_text: str) -> Parsed:
    """A pytest junit-xml report (xunit1: testcases carry `file`) -> pytest node ids."""
    root = ET.fromstring(xml_text)
    tests: dict[str, str] = {}
    messages: dict[str, str] = {}
    for case in root.iter("testcase"):
        name = case.get("name", "")
        classname = case.get("classname", "")
        file = case.get("file")
        if file:
            module = file.removesuffix(".py").replace("/", ".")
            inner = classname[len(module) + 1 :] if classname.startswith(module + ".") else ""
            node_id = "::".join([file, *([p for p in inner.split(".") if p]), name])
        else:
            node_id = f"{classname}::{name}" if classname else name
        status, message = PASSED, ""
        for child in case:
            if child.tag == "failure":
                status, message = FAILED, child.get("message", "") + "\n" + (child.text or "")
            elif child.tag == "error":
                status, message = ERROR, child.get("message", "") + "\n" + (child.text or "")
            elif child.tag == "skipped":
                status = XFAIL if child.get("type") == "pytest.xfail" else SKIPPED
        _record(tests, node_id, status)
        if message and tests[node_id] == status:
            messages[node_id] = message.strip()
    return tests, messages


PARSERS: dict[str, Callable[[str], Parsed]] = {
    "pytest": parse_pytest,
    "parse_log_pytest": parse_pytest,
    "parse_log_pytest_v2": parse_pytest,
    "parse_log_pytest_options": parse_pytest,
    "django": parse_django,
    "parse_log_django": parse_django,
}
