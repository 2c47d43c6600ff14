"""Perturbed twins: the proof that a paying grade comes from the code, not from the test process.

Code a patch adds runs inside the test process and can read everything there (the test files, the
runner, the report), so it can make a test report PASSED without the behaviour the test checks.
What it cannot know is the correct behaviour. A twin of a FAIL_TO_PASS test is the same test, same
name, same lines, same file, with one expected behaviour changed where the test patch adds it:
- `literal`: one constant of a check's expected side (`assert f(x) == 29` -> `== 30`,
  `assertEqual(out, "abc")` -> `"abd"`), the quote style and line kept;
- `exception`: the exception a `pytest.raises` / `assertRaises` block expects, swapped for an
  unrelated builtin one (`ValueError` -> `TypeError`; a project's own exception -> `ValueError`
  or `TypeError`, whichever is not one of its bases);
- `comparison`: `==` <-> `!=`, `in` <-> `not in`, `is` <-> `is not`, `assertEqual` ->
  `assertNotEqual`, `assertTrue` <-> `assertFalse` (only where no literal or exception fits).
A correct fix fails every twin at the perturbed check; code that reports the test passed in both
the original run and the twin run is reading the tests or returning always-equal values. The twin
run is the grade's second run in a fresh sandbox, with the twins in place of the originals and
nothing else different (envs.grading.grader.grade); the perturbed value is one the test patch adds, never
one the base commit's file holds, so git cannot tell the two runs apart either.

A twin is made from the test file's source (a syntax-tree walk: `ast`), and only one that the gold
patch fails at the perturbed check (an AssertionError raised in the test file, or the original
exception escaping) and the unpatched base fails too is kept (envs.grading.grader.checked_twins, stored by
envs.grading.validate): `Task.twins`.
Candidates whose original value the problem statement spells out come last (the statement would
tell a twin from the original), and checks that never run are skipped (after the raising call of
a `raises` block; negative checks such as `!=` and `not in` have no literal twin).
"""

from __future__ import annotations

import ast
import re
from dataclasses import asdict, dataclass

KINDS = ("literal", "exception", "comparison")
_EQUAL_ASSERTS = {
    "assertEqual", "assertEquals", "assertListEqual", "assertTupleEqual", "assertDictEqual", "assertSetEqual",
    "assertSequenceEqual", "assertMultiLineEqual", "assertAlmostEqual", "assertAlmostEquals",
    "assertCountEqual", "assertIs", "assertIn", "assert_equal", "assert_array_equal", "assert_almost_equal",
    "assert_allclose", "assert_frame_equal", "assert_series_equal",
}  # fmt: skip
_SWAP = {  # an expected exception -> an unrelated builtin one (neither a subclass of the other)
    "ValueError": "TypeError", "TypeError": "ValueError", "KeyError": "ValueError",
    "IndexError": "ValueError", "AttributeError": "ValueError", "LookupError": "TypeError",
    "RuntimeError": "ValueError",
    "ZeroDivisionError": "ValueError", "AssertionError": "ValueError", "NotImplementedError": "ValueError",
    "OSError": "ValueError", "FileNotFoundError": "ValueError", "IOError": "ValueError",
    "ImportError": "ValueError", "ModuleNotFoundError": "ValueError", "StopIteration": "ValueError",
    "UnicodeDecodeError": "TypeError", "UnicodeEncodeError": "TypeError", "OverflowError": "TypeError",
    "RecursionError": "ValueError", "ArithmeticError": "TypeError",
}  # fmt: skip
_RAISES = ("raises", "assertRaises", "assertRaisesRegex")
_NEGATED = {"assertEqual": "assertNotEqual", "assertEquals": "assertNotEqual", "assertIs": "assertIsNot",
            "assertIn": "assertNotIn", "assertTrue": "assertFalse", "assertFalse": "assertTrue"}  # fmt: skip
_INVERT = {
    ast.Eq: "!=",
    ast.NotEq: "==",
    ast.In: "not in",
    ast.NotIn: "in",
    ast.Is: "is not",
    ast.IsNot: "is",
}
_OP_TEXT = {
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.Is: "is",
    ast.IsNot: "is not",
}
_HUNK_RE = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@")


@dataclass(frozen=True)
class Twin:
    """One perturbation: in `file` (after the test patch), `line` (1-based) has `old` at character
    `col` replaced by `new`; `tests` are the graded test ids whose expected behaviour it changes."""

    file: str
    line: int
    col: int
    old: str
    new: str
    tests: tuple[str, ...]
    kind: str

    def to_json(self) -> dict:
        return {**asdict(self), "tests": list(self.tests)}

    @classmethod
    def from_json(cls, record: dict) -> Twin:
        tests = tuple(str(t) for t in record["tests"])
        twin = cls(str(record["file"]), int(record["line"]), int(record["col"]), str(record["old"]),
                   str(record["new"]), tests, str(record["kind"]))  # fmt: skip
        if twin.kind not in KINDS or twin.line < 1 or twin.col < 0 or not twin.tests or twin.old == twin.new:
            raise ValueError(f"not a twin: {record!r}")
        return twin

    def applied(self, line: str) -> str:
        """`line` (the file's line `self.line`) with this twin's edit made."""
        if line[self.col : self.col + len(self.old)] != self.old:
            raise ValueError(f"{self.file}:{self.line} does not hold {self.old!r} at column {self.col}")
        return line[: self.col] + self.new + line[self.col + len(self.old) :]


def locate(test_id: str, files: list[str]) -> tuple[list[str], list[str]]:
    """(candidate files, [class..., function]) of a graded test id: pytest's `file::Class::name[param]`,
    or a unittest-style `name (module.Class)` / bare `name` looked up in `files` (the test patch's)."""
    if "::" in test_id:
        file, *parts = test_id.split("::")
        parts[-1] = parts[-1].split("[")[0]
        return [file], parts
    name, _, rest = test_id.partition(" ")
    dotted = rest.strip("()").split(".") if rest.startswith("(") else []
    if dotted and dotted[-1] == name:  # Python 3.11+ unittest: `name (module.Class.name)`
        dotted.pop()
    owner = dotted[-1] if dotted else ""
    return [f for f in files if f.endswith(".py")], [owner, name] if owner else [name]


def _function(tree: ast.Module, path: list[str]) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The function at `path` ([class..., name]); a method a class inherits from a class of the same
    module (a test mixin) is found in that base."""
    classes = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)

    def method(cls: ast.ClassDef, name: str, seen: set[str]) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        found = [n for n in cls.body if isinstance(n, functions) and n.name == name]
        if found:
            return found[-1]
        for base in cls.bases:
            inherited = isinstance(base, ast.Name) and base.id in classes and base.id not in seen
            if inherited and (hit := method(classes[base.id], name, seen | {base.id})) is not None:
                return hit
        return None

    *owners, name = path
    if not owners:
        found = [n for n in tree.body if isinstance(n, functions) and n.name == name]
        return found[-1] if found else None
    scope: list[ast.stmt] = tree.body
    cls = None
    for owner in owners:
        matches = [n for n in scope if isinstance(n, ast.ClassDef) and n.name == owner]
        if not matches:
            return None
        cls, scope = matches[-1], matches[-1].body
    return method(cls, name, {cls.name}) if cls is not None else None


def _constant_like(node: ast.AST) -> bool:
    """An expected value built of constants only (names allowed as callees: `date(2024, 2, 29)`)."""
    callees = {id(m) for n in ast.walk(node) if isinstance(n, ast.Call) for m in ast.walk(n.func)}
    for n in ast.walk(node):
        if isinstance(n, ast.Name | ast.Attribute | ast.Subscript) and id(n) not in callees:
            return False
        if isinstance(n, ast.Lambda | ast.JoinedStr | ast.Starred | ast.comprehension | ast.NamedExpr):
            return False
    return any(isinstance(n, ast.Constant) and n.value is not None for n in ast.walk(node))


def _perturbed(segment: str, value: object) -> str | None:
    """A constant's source text perturbed (a number + 1, a bool negated, one character of a string
    changed, its quote style kept), or None."""
    if isinstance(value, bool):
        return str(not value)
    if isinstance(value, int):
        return str(value + 1) if segment.isdigit() else None
    if isinstance(value, float | str | bytes):
        quotes = re.match(r"^([rRbBuU]{0,2})('''|\"\"\"|'|\")", segment)
        start = quotes.end() if quotes else 0
        end = len(segment) - (len(quotes.group(2)) if quotes else 0)
        body = segment[start:end]
        for i in range(len(body) - 1, -1, -1):
            c = body[i]
            if not c.isascii() or not c.isalnum() or (i > 0 and body[i - 1] == "\\"):
                continue
            repl = (
                chr((ord(c) - 48 + 1) % 10 + 48) if c.isdigit() else chr((ord(c.lower()) - 97 + 1) % 26 + 97)
            )
            repl = repl.upper() if c.isupper() else repl
            new = segment[: start + i] + repl + segment[start + i + 1 :]
            try:
                if ast.literal_eval(new) != value and type(ast.literal_eval(new)) is type(value):
                    return new
            except (ValueError, SyntaxError):
                return None
        return None
    return None


def _after_raise(func: ast.AST) -> set[int]:
    """ids of statements that never run: those after the first of a `with pytest.raises(...)` block."""
    dead = set()
    for n in ast.walk(func):
        if isinstance(n, ast.With | ast.AsyncWith) and _raises_call(n) is not None:
            for stmt in n.body[1:]:
                dead |= {id(m) for m in ast.walk(stmt)}
    return dead


def _raises_call(node: ast.With | ast.AsyncWith) -> ast.Call | None:
    for item in node.items:
        call = item.context_expr
        if isinstance(call, ast.Call) and _callee(call) in _RAISES:
            return call
    return None


def _callee(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


class _Sites:
    """Candidate perturbations of one test function, best first."""

    def __init__(self, source: str, statement: str):
        self.lines = source.splitlines(keepends=True)
        self.statement = statement
        self.found: list[tuple[tuple, int, int, str, str, str]] = []  # (rank, line, col, old, new, kind)

    def _char_col(self, line: int, byte_col: int) -> int:
        return len(self.lines[line - 1].encode("utf-8")[:byte_col].decode("utf-8", "replace"))

    def add(self, node: ast.AST, new: str, kind: str, rank: tuple) -> None:
        if node.lineno != node.end_lineno:
            return
        col, end = (
            self._char_col(node.lineno, node.col_offset),
            self._char_col(node.lineno, node.end_col_offset),
        )
        old = self.lines[node.lineno - 1][col:end]
        bare = re.sub(r"^[rRbBuU]*['\"]+|['\"]+$", "", old)  # a string's text without its quotes
        told = bool(bare.strip()) and bare in self.statement
        self.found.append(((KINDS.index(kind), told, *rank), node.lineno, col, old, new, kind))

    def literal(self, expected: ast.AST, depth: int) -> None:
        for n in ast.walk(expected):
            if isinstance(n, ast.Constant) and n.value is not None:
                segment = ast.get_source_segment("".join(self.lines), n)
                new = _perturbed(segment or "", n.value) if segment else None
                if new is not None:
                    whole = 0 if n is expected else 1 if not isinstance(expected, ast.Call) else 2
                    self.add(n, new, "literal", (whole, depth))


def candidates(source: str, path: list[str], added: set[int], statement: str = "") -> list[tuple]:
    """Perturbations of the test function at `path` in `source`, best first, on `added` lines only:
    [(line, col, old, new, kind)]."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    func = _function(tree, path)
    if func is None:
        return []
    sites = _Sites(source, statement)
    dead = _after_raise(func)
    stores = {}
    loads: dict[str, int] = {}
    for n in ast.walk(func):
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            stores.setdefault(n.targets[0].id, []).append(n.value)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            loads[n.id] = loads.get(n.id, 0) + 1

    def expected_of(node: ast.AST) -> ast.AST | None:
        if _constant_like(node):
            return node
        if isinstance(node, ast.Name) and loads.get(node.id) == 1 and len(stores.get(node.id, [])) == 1:
            value = stores[node.id][0]
            return value if _constant_like(value) else None  # a local holding only the expected value
        return None

    for depth, n in enumerate(ast.walk(func)):
        if id(n) in dead or getattr(n, "lineno", None) not in added:
            continue
        if isinstance(n, ast.Assert) and isinstance(n.test, ast.Compare) and len(n.test.ops) == 1:
            op, left, right = type(n.test.ops[0]), n.test.left, n.test.comparators[0]
            if op in (ast.Eq, ast.Is, ast.In):
                for side in (right, left) if op is not ast.In else (left,):
                    if (exp := expected_of(side)) is not None and getattr(exp, "lineno", 0) in added:
                        sites.literal(exp, depth)
                        break
            if op in _INVERT:
                _comparison(sites, n.test, op, depth)
        elif isinstance(n, ast.Call) and _callee(n) in _EQUAL_ASSERTS and len(n.args) >= 2:
            for arg in (n.args[1], n.args[0]):
                if (exp := expected_of(arg)) is not None and getattr(exp, "lineno", 0) in added:
                    sites.literal(exp, depth)
                    break
            if _callee(n) in _NEGATED:
                _negated_call(sites, n, depth)
        elif isinstance(n, ast.Call) and _callee(n) in ("assertTrue", "assertFalse") and n.args:
            _negated_call(sites, n, depth)
        elif isinstance(n, ast.Call) and _callee(n) in _RAISES and n.args and not _in_with(n, func):
            _exception(sites, n, depth)  # toolz's `assert raises(LookupError, f)`, `self.assertRaises(E, f)`
        elif isinstance(n, ast.With | ast.AsyncWith) and (call := _raises_call(n)) is not None and call.args:
            _exception(sites, call, depth)
    ranked = sorted(sites.found, key=lambda s: s[0])
    return [s[1:] for s in ranked]


def _exception(sites: _Sites, call: ast.Call, depth: int) -> None:
    """The expected exception of a raises call swapped for an unrelated one."""
    exc = call.args[0]
    name = exc.id if isinstance(exc, ast.Name) else exc.attr if isinstance(exc, ast.Attribute) else None
    swaps = [_SWAP[name]] if name in _SWAP else ["ValueError", "TypeError"] if name else []
    for rank, swap in enumerate(swaps):  # a project's own exception: validation rules out its bases
        sites.add(exc, swap, "exception", (rank, depth))


def _in_with(call: ast.Call, func: ast.AST) -> bool:
    return any(
        isinstance(n, ast.With | ast.AsyncWith) and any(item.context_expr is call for item in n.items)
        for n in ast.walk(func)
    )


def _negated_call(sites: _Sites, call: ast.Call, depth: int) -> None:
    """`self.assertEqual(a, b)` -> `self.assertNotEqual(a, b)` (and the like): the method's name."""
    attr = call.func
    if not isinstance(attr, ast.Attribute) or attr.end_lineno != attr.lineno:
        return
    end = sites._char_col(attr.lineno, attr.end_col_offset)
    col = end - len(attr.attr)
    if sites.lines[attr.lineno - 1][col:end] != attr.attr:
        return
    sites.found.append(((KINDS.index("comparison"), False, 1, depth), attr.lineno, col, attr.attr,
                        _NEGATED[attr.attr], "comparison"))  # fmt: skip


def _comparison(sites: _Sites, test: ast.Compare, op: type, depth: int) -> None:
    """`a OP b` -> `a NOT-OP b`, the operator's own text located between the two operands."""
    left, right = test.left, test.comparators[0]
    if left.end_lineno != right.lineno or left.lineno != test.lineno:
        return
    line = sites.lines[test.lineno - 1]
    a, b = (
        sites._char_col(left.end_lineno, left.end_col_offset),
        sites._char_col(right.lineno, right.col_offset),
    )
    between = line[a:b]
    m = re.search(re.escape(_OP_TEXT[op]).replace(r"\ ", r"\s+"), between)
    if m is None:
        return
    sites.found.append(((KINDS.index("comparison"), False, 0, depth), test.lineno, a + m.start(), m.group(0),
                        _INVERT[op], "comparison"))  # fmt: skip


def added_lines(diff: str) -> dict[str, dict[int, int]]:
    """{file: {line number in the new file: index of its `+` line in diff.splitlines(keepends=True)}}
    for every line a (trusted, task-owned) diff adds."""
    out: dict[str, dict[int, int]] = {}
    current: dict[int, int] | None = None
    line_no = 0
    for i, raw in enumerate(diff.splitlines(keepends=True)):
        if raw.startswith("diff --git "):
            current = None
        elif raw.startswith("+++ "):
            name = raw[4:].rstrip("\r\n")
            current = (
                None
                if name == "/dev/null"
                else out.setdefault(name[2:] if name.startswith("b/") else name, {})
            )
        elif (m := _HUNK_RE.match(raw)) and current is not None:
            line_no = int(m.group(1))
        elif current is not None and raw.startswith("+"):
            current[line_no] = i
            line_no += 1
        elif current is not None and raw.startswith(" "):
            line_no += 1
    return out


def make_twins(task, sources: dict[str, str], *, skip: int = 0) -> tuple[Twin, ...]:
    """One twin per FAIL_TO_PASS test function (its `skip`-th best candidate), from the test files'
    sources after the test patch (`sources`: path -> text)."""
    added = added_lines(task.test_patch)
    files = list(added)
    by_site: dict[tuple, list[str]] = {}
    for test_id in task.fail_to_pass:
        where, path = locate(test_id, files)
        for file in where:
            if file not in sources:
                continue
            found = candidates(sources[file], path, set(added.get(file, {})), task.problem_statement)
            if len(found) > skip:
                line, col, old, new, kind = found[skip]
                by_site.setdefault((file, line, col, old, new, kind), []).append(test_id)
                break
    twins = [
        Twin(f, line, col, old, new, tuple(ids), kind)
        for (f, line, col, old, new, kind), ids in by_site.items()
    ]
    lines_used = [(t.file, t.line) for t in twins]  # two twins on one line would overlap: keep the first
    return tuple(t for i, t in enumerate(twins) if (t.file, t.line) not in lines_used[:i])


def twin_patch(test_patch: str, twins: tuple[Twin, ...]) -> str:
    """`test_patch` with each twin's `+` line edited: the diff that puts the twins in place of the
    originals (the same hunks, lines and files)."""
    lines = test_patch.splitlines(keepends=True)
    added = added_lines(test_patch)
    for twin in twins:
        index = added.get(twin.file, {}).get(twin.line)
        if index is None:
            raise ValueError(f"the test patch does not add {twin.file}:{twin.line}")
        lines[index] = "+" + twin.applied(lines[index][1:])
    return "".join(lines)


def fit(task) -> bool:
    """Whether `task.twins` are twins of its FAIL_TO_PASS tests in its test patch (a record edited
    since its twins were made has stale ones)."""
    if task.twins is None:
        return False
    try:
        twin_patch(task.test_patch, task.twins)
    except ValueError:
        return False
    return all(set(t.tests) <= set(task.fail_to_pass) for t in task.twins)
