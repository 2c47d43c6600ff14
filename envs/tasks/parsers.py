"""Test statuses: parsing test logs and junit-xml reports, and SWE-bench's rules for grading them.

Statuses: PASSED, FAILED, ERROR, SKIPPED, XFAIL. Test ids are the official parsers' ids: pytest
node ids named by the COLLECTING file (an inherited test method is `tests/test_child.py::Child::
test_m`, not the file that defines it), cut at the first whitespace when read from a log (so
`test_x[a b]` is published as `test_x[a`), Django's `test_m (module.Class)` or the docstring
line it prints instead.

Grading rules (`graded_failures`, one set per harness: SWE-bench 5.x, 4.x, SWE-rebench V2): a
graded id matches exactly; an id with more `[` than `]` (truncated at a space) matches the reported
ids it prefixes (5.x: when they all agree on passing vs failing; 4.x: the last). A missing test
fails. A task with reference statuses (the gold run's, recorded at validation) is stricter:
PASSED, or XFAIL / SKIPPED only where gold had the same.

Text parsers by name: jaxswe's own `pytest` (reads only the last `short test summary info`
section, so lines an agent's code prints elsewhere are not read) and `django`, which agree with
the official ones on real logs (tests/environments/tasks/test_parsers_official.py); every other name (e.g.
`parse_log_sympy`) is the official parser of the `swebench` package (envs.tasks.official).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable

from envs.errors import TaskError
from envs.tasks import official

PASSED, FAILED, ERROR, SKIPPED, XFAIL = "PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL"
MISSING = "MISSING"
STATUSES = (PASSED, FAILED, ERROR, SKIPPED, XFAIL, MISSING)
PASSING = frozenset({PASSED, XFAIL})
_RANK = {PASSED: 0, XFAIL: 0, SKIPPED: 1, FAILED: 2, ERROR: 3}

Parsed = tuple[dict[str, str], dict[str, str]]  # (status per test, failure message per test)


def _record(tests: dict[str, str], name: str, status: str) -> None:
    """Keep the worst status of a test reported twice (e.g. passed, then errored in teardown)."""
    if name not in tests or _RANK.get(status, 3) > _RANK.get(tests[name], 3):
        tests[name] = status


# -- grading rules --------------------------------------------------------------------------------
RULES = ("swebench-5", "swebench-4", "rebench-v2")  # each harness's rules (Task.rules picks one)


def resolve(case: str, tests: dict[str, str], rules: str = "swebench-5") -> str | None:
    """The reported id a graded id names (see the module docstring), or None."""
    if case in tests:
        return case
    if case.count("[") > case.count("]"):
        matches = [k for k in tests if k.startswith(case)]
        if matches and rules == "swebench-4":  # its parsers collapse the ids: the last line wins
            return matches[-1]
        if matches and len({tests[k] in PASSING for k in matches}) == 1:
            return matches[0]
    return None


def status_of(case: str, tests: dict[str, str], rules: str = "swebench-5") -> str:
    key = resolve(case, tests, rules)
    return MISSING if key is None else tests[key]


def graded_failures(
    fail_to_pass: Iterable[str], pass_to_pass: Iterable[str], tests: dict[str, str],
    reference: dict[str, str] | None = None, rules: str = "swebench-5", ignored: Iterable[str] = (),
) -> list[tuple[str, str]]:  # fmt: skip
    """(test, status) of every graded test that breaks `rules`; empty when resolved.

    - swebench-5 (SWE-bench 5.x): FAIL_TO_PASS must pass (PASSED, XFAIL); PASS_TO_PASS passes or is
      SKIPPED; a truncated id resolves when every id it prefixes agrees.
    - swebench-4 (SWE-bench 4.x, which SWE-rebench V1, SWE-smith and SWE-Gym grade with): PASSED
      and XFAIL pass, FAILED, ERROR and missing fail, SKIPPED counts for neither list; a truncated
      id takes the last test it prefixes.
    - rebench-v2 (SWE-rebench V2): the PASSED tests are exactly FAIL_TO_PASS + PASS_TO_PASS (a
      passing test outside them fails the task too, as `(id, "PASSED, not graded")`); `ignored`
      (canaries) are left out of that set.
    With `reference` (each graded test's status under the gold patch), a graded test passes only
    as PASSED, or as XFAIL / SKIPPED where its reference status is the same."""
    fail_to_pass, pass_to_pass = list(fail_to_pass), list(pass_to_pass)
    graded = [*fail_to_pass, *pass_to_pass]
    status = {t: status_of(t, tests, rules) for t in graded}
    extra: list[tuple[str, str]] = []
    if rules == "rebench-v2":
        skip = set(graded) | set(ignored)
        extra = [(t, "PASSED, not graded") for t, s in tests.items() if s == PASSED and t not in skip]
    if reference:
        return [
            (t, status[t])
            for t in graded
            if status[t] != PASSED and not (status[t] in (XFAIL, SKIPPED) and reference.get(t) == status[t])
        ] + extra
    if rules == "rebench-v2":
        return [(t, status[t]) for t in graded if status[t] != PASSED] + extra
    if rules == "swebench-4":
        return [(t, status[t]) for t in graded if status[t] in (FAILED, ERROR, MISSING)]
    ok_p2p = PASSING | {SKIPPED}
    return [(t, status[t]) for t in fail_to_pass if status[t] not in PASSING] + [
        (t, status[t]) for t in pass_to_pass if status[t] not in ok_p2p
    ]


# -- text parsers ---------------------------------------------------------------------------------
_SUMMARY_RE = re.compile(r"^=+ short test summary info =+$")
_STATUS_WORDS = (PASSED, FAILED, ERROR, XFAIL, SKIPPED)  # SWE-bench has no XPASS: such a test is missing
_SKIP_COUNT_RE = re.compile(r"^\[\d+\]$")  # `SKIPPED [2] file:line: reason` names no test


def parse_pytest(log: str) -> Parsed:
    """`pytest -rA`: the lines of the LAST `short test summary info` section; the id is the first
    whitespace-separated word after the status, as SWE-bench's parse_log_pytest takes it."""
    lines = log.splitlines()
    starts = [i for i, ln in enumerate(lines) if _SUMMARY_RE.match(ln.strip())]
    tests: dict[str, str] = {}
    messages: dict[str, str] = {}
    for line in lines[starts[-1] + 1 :] if starts else []:
        if line.startswith("="):
            break
        words = line.split()
        if len(words) < 2 or words[0] not in _STATUS_WORDS or _SKIP_COUNT_RE.match(words[1]):
            continue
        status = words[0]
        _record(tests, words[1], status)
        if " - " in line and status in (FAILED, ERROR):
            messages[words[1]] = line.split(" - ", 1)[1]
    return tests, messages


_VERBOSE_RE = re.compile(r"^(\S+)\s+(PASSED|FAILED|SKIPPED|ERROR|XFAIL)")


def parse_pytest_verbose(log: str) -> Parsed:
    """`pytest --verbose` lines `id STATUS [ 10%]`, as SWE-smith's parser reads them: an id with a
    space does not match at all, and a test reported twice keeps its last status."""
    tests: dict[str, str] = {}
    for line in log.splitlines():
        if m := _VERBOSE_RE.match(line):
            tests[m.group(1)] = m.group(2)
    return tests, {}


def parse_django(log: str) -> Parsed:
    """Django's runtests.py at verbosity 2: `test_m (module.Class) ... ok`; a test with a docstring
    is named by the docstring's first line, as SWE-bench's parse_log_django names it."""
    tests: dict[str, str] = {}
    previous = None
    for raw in log.splitlines():
        line = raw.strip()
        if " ... " in line:
            previous = line.split(" ... ")[0]
        if line.endswith((" ... ok", " ... OK", " ...  OK")):
            tests[line.rsplit(" ...", 1)[0].rstrip()] = PASSED
        if " ... skipped" in line:
            tests[line.split(" ... skipped")[0]] = SKIPPED
        if line.endswith(" ... FAIL"):
            tests[line.split(" ... FAIL")[0]] = FAILED
        if line.endswith(" ... ERROR"):
            tests[line.split(" ... ERROR")[0]] = ERROR
        if line.startswith(("FAIL:", "ERROR:")) and len(line.split()) > 1:
            tests[line.split()[1]] = FAILED if line.startswith("FAIL:") else ERROR
        if line.startswith("ok") and previous is not None:
            tests[previous] = PASSED  # output between `...` and `ok`
    return tests, {}


def _official(name: str) -> Callable[[str], Parsed] | None:
    fn = official.parser(name=name)
    return None if fn is None else (lambda log: (fn(log), {}))


_OWN: dict[str, Callable[[str], Parsed]] = {
    "pytest": parse_pytest,
    "parse_log_pytest": parse_pytest,
    "django": parse_django,
    "parse_log_django": parse_django,
    "pytest_verbose": parse_pytest_verbose,  # SWE-smith's (its records name no parser)
}
# SWE-bench's repo -> parser names for repos whose parser is not plain pytest.
_BY_REPO_FALLBACK = {"django/django": "parse_log_django"}


class _Parsers:
    """`PARSERS[name]`: a parser by name (jaxswe's own first, then the official package's)."""

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in _OWN or _official(name) is not None)

    def __getitem__(self, name: str) -> Callable[[str], Parsed]:
        fn = _OWN.get(name) or _official(name)
        if fn is None:
            hint = "" if official.available() else f" ({official.INSTALL_HINT})"
            raise TaskError(f"unknown log parser {name!r}{hint}")
        return fn


PARSERS = _Parsers()


def parser_name_for_repo(repo: str) -> str:
    """SWE-bench's parser for a repository (e.g. sympy/sympy -> parse_log_sympy), pytest otherwise."""
    if repo.startswith("builtin/"):  # jaxswe's own suite: no need to import swebench (~150 MB)
        return "parse_log_pytest"
    return official.parser_name(repo) or _BY_REPO_FALLBACK.get(repo, "parse_log_pytest")


# -- junit-xml ------------------------------------------------------------------------------------
def _module_parts(parts: list[str], file: str | None, files: frozenset[str] | None) -> int:
    """How many leading parts of a junit classname name the collecting module."""
    if file:
        dotted = file.removesuffix(".py").replace("/", ".").split(".")
        if parts[: len(dotted)] == dotted:
            return len(dotted)
    if files:  # the longest prefix that is a file of the repository
        for k in range(len(parts), 0, -1):
            if "/".join(parts[:k]) + ".py" in files:
                return k
    for k, part in enumerate(parts):  # pytest collects classes `Test*`; modules are lower case
        if part[:1].isupper():
            return k
    return len(parts)


def parse_junit_xml(xml_text: str, files: Iterable[str] | None = None) -> Parsed:
    """A pytest junit-xml report (xunit1) -> pytest node ids of the collecting file. `files`
    (repository paths) places a class inherited from another file; without it, the first
    capitalised part of the classname starts the class path."""
    root = ET.fromstring(xml_text)
    files = frozenset(files) if files is not None else None
    tests: dict[str, str] = {}
    messages: dict[str, str] = {}
    for case in root.iter("testcase"):
        name = case.get("name", "")
        classname = case.get("classname", "")
        parts = [p for p in classname.split(".") if p]
        if parts:
            k = _module_parts(parts, case.get("file"), files)
            node_id = "::".join(["/".join(parts[:k]) + ".py" if k else "", *parts[k:], name]).lstrip(":")
        else:
            node_id = name
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
