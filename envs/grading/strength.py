"""Test strength: how many plausible wrong fixes a task's tests reject.

Wrong fixes are derived from the gold patch on a private checkout of the task's clean repository:
- each hunk reverted alone (when gold has more than one hunk: the fix applied in one place of several;
  not the hunks of documentation files, which no test runs);
- one mutation of the Python code gold adds, found with `ast` and made at the node's exact source
  position: operator (`+`/`-`, `*`/`/`, `//`/`*`, `%`/`*`, `and`/`or`, `not` dropped), comparison
  (`==`/`!=`, `<`/`>=`, `>`/`<=`, `in`/`not in`, `is`/`is not`), boundary (`<`/`<=`, `>`/`>=`, an
  off-by-one of a slice bound or a `range()` argument), constant (a number +1 and -1, `True`/`False`,
  a string emptied), call (a call replaced by its one argument, or its last argument dropped) and
  condition (a comprehension's `if` dropped); never in a docstring, an f-string or a type annotation.
Each is a git diff against the base commit, graded in the task's own environment by the training
grader (`envs.grading.grader.grade`) with `twins=False`: the twin run only confirms a grade that pays, and
a wrong fix should not pay at all, so it would decide nothing here and double the cost of survivors.

Equivalent mutants are bounded, not decided: a wrong fix whose changed Python module compiles to
what gold's does (the same instructions and argument values, positions and constants no instruction
loads ignored, `if TYPE_CHECKING:` blocks left out: e.g. `if 2:` for `if 1:`, a hunk that only
imports for type checkers) is dropped before grading and counted as equivalent. A survivor may
still be equivalent on every input; it counts against the task and is reported as "possibly
equivalent": the strength is a lower bound. Fixes that could not be graded (sandbox failures, the
seconds budget spent) are undecided and left out of the figure: strength = rejected / (rejected +
survivors), None when nothing was decided.

Cost is bounded per task: at most `budget` wrong fixes (hunk reverts first, then mutations spread
over the kinds), no new grade after `seconds`, `workers` grades at once."""

from __future__ import annotations

import ast
import dis
import io
import shutil
import subprocess
import tempfile
import time
import tokenize
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from itertools import pairwise
from pathlib import Path
from types import CodeType
from typing import Any

from envs.errors import EnvError
from envs.grading.grader import grade
from envs.host_git import git, host_env
from envs.tasks.patches import is_test_path, patch_files
from envs.tasks.records import Task
from envs.tasks.repos import clean_template
from envs.tasks.twins import added_lines

DEFAULT_BUDGET = 12  # wrong fixes graded per task
DEFAULT_SECONDS = 300.0  # no new grade of a task's wrong fixes after this

_BINOPS = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "/"), ast.Div: ("/", "*"),
           ast.FloorDiv: ("//", "*"), ast.Mod: ("%", "*")}  # fmt: skip
_NEGATED = {ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.Lt: ("<", ">="), ast.GtE: (">=", "<"),
            ast.Gt: (">", "<="), ast.LtE: ("<=", ">"), ast.In: ("in", "not in"),
            ast.NotIn: ("not in", "in"), ast.Is: ("is", "is not"), ast.IsNot: ("is not", "is")}  # fmt: skip
_BOUNDARY = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">")}
_BOOLOPS = {ast.And: ("and", "or"), ast.Or: ("or", "and")}
_DOC_SUFFIXES = (".rst", ".md", ".txt", ".adoc")
_DOC_NAMES = ("CHANGES", "CHANGELOG", "HISTORY", "NEWS", "README", "AUTHORS")
KINDS = ("hunk reverted", "operator", "comparison", "boundary", "constant", "call", "condition")


@dataclass(frozen=True)
class WrongFix:
    """One plausible wrong fix: `kind` (KINDS), `where` (path:line, or the hunk), `change`, `patch`."""

    kind: str
    where: str
    change: str
    patch: str

    def to_json(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class Strength:
    """The outcome of `measure`: `strength` = rejected / (rejected + len(survivors)), None when no
    wrong fix was decided; `equivalent` mutants were dropped (compiled code equal to gold's);
    `undecided` fixes were not graded to a verdict; `unbudgeted` were made but over the budget."""

    instance_id: str
    strength: float | None
    rejected: int
    survivors: tuple[WrongFix, ...]
    equivalent: int
    undecided: int
    unbudgeted: int
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "survivors": [s.to_json() for s in self.survivors]}


# ---- positions: ast gives UTF-8 byte columns, text edits use character columns


class _Source:
    """A file's text with its lines and tokens, and edits at ast positions."""

    def __init__(self, text: str):
        self.text = text
        self.lines = text.splitlines(keepends=True)
        self.tokens = [t for t in tokenize.generate_tokens(io.StringIO(text).readline)
                       if t.type in (tokenize.OP, tokenize.NAME)]  # fmt: skip

    def char_col(self, line: int, byte_col: int) -> int:
        return len(self.lines[line - 1].encode()[:byte_col].decode(errors="replace"))

    def start(self, node: ast.AST) -> tuple[int, int]:
        return node.lineno, self.char_col(node.lineno, node.col_offset)

    def end(self, node: ast.AST) -> tuple[int, int]:
        return node.end_lineno, self.char_col(node.end_lineno, node.end_col_offset)

    def tokens_between(self, start: tuple[int, int], end: tuple[int, int]) -> list[tokenize.TokenInfo]:
        """The operator and keyword tokens between two positions (what sits between two operands)."""
        return [t for t in self.tokens if start <= t.start and t.end <= end and t.string not in "()"]

    def edit(self, start: tuple[int, int], end: tuple[int, int], new: str) -> str:
        offsets = [0]
        for line in self.lines:
            offsets.append(offsets[-1] + len(line))
        a = offsets[start[0] - 1] + start[1]
        b = offsets[end[0] - 1] + end[1]
        return self.text[:a] + new + self.text[b:]


def _operator_span(src: _Source, left: ast.AST, right: ast.AST) -> tuple[tuple[int, int], tuple[int, int]]:
    """The span of the operator between two operands (`not in` and `is not` are two tokens)."""
    tokens = src.tokens_between(src.end(left), src.start(right))
    if not tokens:
        raise ValueError("no operator token between the operands")
    return tokens[0].start, tokens[-1].end


def _docstring_nodes(tree: ast.AST) -> set[int]:
    """ids of the docstring constants (never mutated: they do nothing)."""
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        value = first.value if isinstance(first, ast.Expr) else None
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            out.add(id(value))
    return out


def _annotation_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes in type annotations (never mutated: a type hint is no fix)."""
    roots = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            roots.append(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
            roots.append(node.returns)
    return {id(n) for root in roots for n in ast.walk(root)}


def _constant_mutations(node: ast.Constant) -> list[tuple[str, str]]:
    """(replacement source, change) for one constant."""
    value = node.value
    if isinstance(value, bool):
        return [(repr(not value), f"{value!r} -> {not value!r}")]
    if isinstance(value, int | float) and not isinstance(value, complex):
        return [
            (repr(value + 1), f"{value!r} -> {value + 1!r}"),
            (repr(value - 1), f"{value!r} -> {value - 1!r}"),
        ]
    if isinstance(value, str) and value:
        return [('""', f"{value[:20]!r} -> ''")]
    return []


def _bounds(node: ast.AST) -> list[ast.expr]:
    """The non-constant bounds of a slice or of a `range(...)` call (constants get +-1 as constants)."""
    if isinstance(node, ast.Slice):
        bounds = [node.lower, node.upper]
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range":
        bounds = list(node.args)
    else:
        return []
    return [b for b in bounds if b is not None and not isinstance(b, ast.Constant)]


def _partial(src: _Source, node: ast.AST) -> Iterator[tuple[str, str, str]]:
    """(kind, change, mutated text): a call replaced by its one (non-constant) argument or its last
    argument dropped (`call`), a comprehension's filter dropped (`condition`)."""
    if isinstance(node, ast.Call) and not node.keywords and len(node.args) == 1:
        arg = node.args[0]
        if not isinstance(arg, ast.Starred | ast.Constant):
            old = ast.get_source_segment(src.text, arg)
            yield (
                "call",
                f"{ast.get_source_segment(src.text, node.func)}({old}) -> {old}",
                src.edit(src.start(node), src.end(node), old),
            )
    elif isinstance(node, ast.Call) and not node.keywords and len(node.args) > 1:
        last = ast.get_source_segment(src.text, node.args[-1])
        yield "call", f"argument {last} dropped", src.edit(src.end(node.args[-2]), src.end(node.args[-1]), "")
    elif not isinstance(node, ast.Call):
        for generator in node.generators:
            for before, cond in pairwise([generator.iter, *generator.ifs]):
                old = ast.get_source_segment(src.text, cond)
                yield "condition", f"if {old} dropped", src.edit(src.end(before), src.end(cond), "")


def mutations(text: str, added: Iterable[int]) -> Iterator[tuple[str, int, str, str]]:
    """(kind, line, change, mutated text) for each single mutation of the code on the `added` lines."""
    src = _Source(text)
    tree = ast.parse(text)
    added = set(added)
    skip = (
        _docstring_nodes(tree)
        | _annotation_nodes(tree)
        | {id(c) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for c in ast.walk(n)}
    )

    def on_added(node: ast.AST) -> bool:
        return all(n in added for n in range(node.lineno, node.end_lineno + 1))

    for node in ast.walk(tree):
        if id(node) in skip or not hasattr(node, "lineno") or not on_added(node):
            continue
        line = node.lineno
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            old, new = _BINOPS[type(node.op)]
            a, b = _operator_span(src, node.left, node.right)
            yield "operator", line, f"{old} -> {new}", src.edit(a, b, new)
        elif isinstance(node, ast.BoolOp):
            old, new = _BOOLOPS[type(node.op)]
            for left, right in pairwise(node.values):
                a, b = _operator_span(src, left, right)
                yield "operator", line, f"{old} -> {new}", src.edit(a, b, new)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            a = src.start(node)
            yield "operator", line, "not dropped", src.edit(a, (a[0], a[1] + len("not")), "")
        elif isinstance(node, ast.Compare):
            for op, (left, right) in zip(node.ops, pairwise([node.left, *node.comparators]), strict=True):
                a, b = _operator_span(src, left, right)
                old, new = _NEGATED[type(op)]
                yield "comparison", line, f"{old} -> {new}", src.edit(a, b, f" {new} ")
                if type(op) in _BOUNDARY:
                    old, new = _BOUNDARY[type(op)]
                    yield "boundary", line, f"{old} -> {new}", src.edit(a, b, f" {new} ")
        elif bounds := _bounds(node):
            for bound in bounds:
                old = ast.get_source_segment(text, bound)
                for sign in "+-":
                    yield (
                        "boundary",
                        line,
                        f"{old} -> {old} {sign} 1",
                        src.edit(src.start(bound), src.end(bound), f"({old}) {sign} 1"),
                    )
        elif isinstance(node, ast.Constant):
            for new, change in _constant_mutations(node):
                yield "constant", line, change, src.edit(src.start(node), src.end(node), new)
        elif isinstance(node, ast.Call | ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
            for kind, change, text_ in _partial(src, node):
                yield kind, line, change, text_


# ---- equivalence bound: compiled code equal to gold's


def _code_key(code: CodeType) -> tuple:
    """What a code object does: its instructions with their argument values (constants by type and
    value, nested code by its own key), without where it came from (line and column tables) and
    without constants no instruction loads (a folded-away test)."""
    ops = tuple(
        (
            i.opname,
            _code_key(i.argval)
            if isinstance(i.argval, CodeType)
            else (type(i.argval).__name__, repr(i.argval)),
        )
        for i in dis.get_instructions(code)
    )
    return (ops, code.co_varnames, code.co_freevars, code.co_cellvars, code.co_flags, code.co_argcount,
            code.co_posonlyargcount, code.co_kwonlyargcount, code.co_exceptiontable)  # fmt: skip


class _RuntimeOnly(ast.NodeTransformer):
    """A module without its `if TYPE_CHECKING:` blocks (never run; their `else:` kept)."""

    def visit_If(self, node: ast.If) -> ast.AST | list[ast.stmt]:
        self.generic_visit(node)
        test = node.test
        name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
        return (node.orelse or [ast.Pass()]) if name == "TYPE_CHECKING" else node


def compiled_key(text: str, path: str) -> tuple | None:
    """The compiled form of a module's source, `if TYPE_CHECKING:` blocks left out (None: it does
    not compile)."""
    try:
        tree = ast.fix_missing_locations(_RuntimeOnly().visit(ast.parse(text, path)))
        return _code_key(compile(tree, path, "exec", dont_inherit=True))
    except (SyntaxError, ValueError):
        return None


# ---- making the wrong fixes on a private checkout


def _hunks(patch: str) -> list[tuple[int, int, str]]:
    """(file section index, line index, file) of each hunk header in `patch`."""
    out, section, path = [], -1, ""
    for i, line in enumerate(patch.splitlines(keepends=True)):
        if line.startswith("diff --git "):
            section, path = section + 1, line.rstrip("\n").split(" b/", 1)[-1]
        elif line.startswith("@@ ") and section >= 0:
            out.append((section, i, path))
    return out


def _documentation(path: str) -> bool:
    """A file no test runs (reverting its hunk changes no behaviour): docs, change logs, readmes."""
    name = path.rsplit("/", 1)[-1].upper()
    return path.endswith(_DOC_SUFFIXES) or name.startswith(_DOC_NAMES)


def without_hunk(patch: str, index: int) -> str:
    """`patch` with its `index`-th hunk left out (its file section too when that was its only hunk)."""
    lines = patch.splitlines(keepends=True)
    hunks = _hunks(patch)
    section, first, _ = hunks[index]
    ends = [i for i, line in enumerate(lines) if line.startswith(("diff --git ", "@@ "))] + [len(lines)]
    last = next(e for e in ends if e > first)
    if sum(s == section for s, _, _ in hunks) == 1:
        starts = [i for i, line in enumerate(lines) if line.startswith("diff --git ")] + [len(lines)]
        first, last = starts[section], starts[section + 1]
    return "".join(lines[:first] + lines[last:])


def _diff(checkout: Path) -> str:
    git(checkout, "add", "-A")
    return git(checkout, "diff", "--cached", "--no-color", "--no-ext-diff", "--binary", "HEAD")


def _apply(checkout: Path, patch: str) -> bool:
    name = checkout / ".git" / "jaxswe-strength.diff"
    name.write_text(patch)
    done = subprocess.run(["git", "-C", str(checkout), "apply", "--whitespace=nowarn", str(name)],
                          capture_output=True, env=host_env())  # fmt: skip
    return done.returncode == 0


def _hunk_reverts(checkout: Path, patch: str, gold_keys: dict[str, tuple]) -> tuple[list[WrongFix], int]:
    """(gold with each hunk left out in turn, how many of those compile to gold's code)."""
    out, equivalent = [], 0
    hunks = _hunks(patch)
    for i in range(len(hunks) if len(hunks) > 1 else 0):
        partial = without_hunk(patch, i)
        if not partial.strip() or _documentation(hunks[i][2]):
            continue
        if not _apply(checkout, partial):
            continue  # the other hunks do not apply without it: not a fix anyone could submit
        header = patch.splitlines()[hunks[i][1]]
        path = hunks[i][2]
        if path in gold_keys and _file_key(checkout, path) == gold_keys[path]:
            equivalent += 1
        else:
            out.append(WrongFix("hunk reverted", f"{path} (hunk {i + 1} of {len(hunks)})", header[:80],
                                _diff(checkout)))  # fmt: skip
        _clean(checkout)
    return out, equivalent


def _clean(checkout: Path) -> None:
    git(checkout, "reset", "-q", "--hard", "HEAD")  # the private checkout only
    git(checkout, "clean", "-qfd")


def _file_key(checkout: Path, path: str) -> tuple | None:
    file = checkout / path
    return compiled_key(file.read_text(), path) if file.is_file() else None


def _mutants(checkout: Path, task: Task) -> tuple[list[WrongFix], int, dict[str, tuple]]:
    """(mutants of gold's added Python code, how many were dropped as equivalent to gold, the
    compiled key of each Python file gold leaves)."""
    if not _apply(checkout, task.patch):
        raise EnvError(f"task {task.instance_id}: the gold patch does not apply to its clean repository")
    out, equivalent, seen = [], 0, set()
    gold_keys = {
        p: key for p in patch_files(task.patch) if p.endswith(".py") and (key := _file_key(checkout, p))
    }
    for path, lines in added_lines(task.patch).items():
        if not path.endswith(".py") or is_test_path(path):
            continue
        file = checkout / path
        gold = file.read_text()
        gold_key = compiled_key(gold, path)
        if gold_key is None:
            continue
        for kind, line, change, text in mutations(gold, lines):
            key = compiled_key(text, path)
            if key is None or (path, key) in seen:
                continue  # does not compile, or a mutant already made
            seen.add((path, key))
            if key == gold_key:
                equivalent += 1
                continue
            file.write_text(text)
            out.append(WrongFix(kind, f"{path}:{line}", change, _diff(checkout)))
        file.write_text(gold)
    _clean(checkout)
    return out, equivalent, gold_keys


def wrong_fixes(task: Task) -> tuple[list[WrongFix], int]:
    """(every wrong fix derived from the task's gold patch, the count of those equivalent to gold)."""
    with tempfile.TemporaryDirectory(prefix="jaxswe-strength-") as tmp:
        checkout = Path(tmp) / "repo"
        shutil.copytree(clean_template(task), checkout, symlinks=True)
        try:
            mutants, equivalent, gold_keys = _mutants(checkout, task)
            reverts, equivalent_reverts = _hunk_reverts(checkout, task.patch, gold_keys)
        except (SyntaxError, ValueError) as err:
            raise EnvError(f"task {task.instance_id}: cannot derive wrong fixes: {err}") from None
    return reverts + mutants, equivalent + equivalent_reverts


def _spread(fixes: list[WrongFix]) -> list[WrongFix]:
    """The fixes ordered kind by kind in turn (hunk reverts first), so a budget samples every kind."""
    by_kind = [[f for f in fixes if f.kind == k] for k in KINDS]
    out = []
    while any(by_kind):
        out += [group.pop(0) for group in by_kind if group]
    return out


def measure(task: Task, *, backend: str = "local", budget: int = DEFAULT_BUDGET,
            seconds: float = DEFAULT_SECONDS, workers: int = 1, **limits: Any) -> Strength:  # fmt: skip
    """Grade up to `budget` wrong fixes of `task` (`workers` at once; none started after `seconds`)."""
    if budget < 1:
        raise EnvError(f"budget must be >= 1 wrong fix, got {budget}")
    start = time.monotonic()
    fixes, equivalent = wrong_fixes(task)
    chosen = _spread(fixes)[:budget]

    def verdict(fix: WrongFix) -> bool | None:
        """True: rejected; False: it pays; None: undecided."""
        if time.monotonic() - start > seconds:
            return None
        result = grade(task, fix.patch, backend, twins=False, **limits)
        return None if result.error else not result.resolved

    with ThreadPoolExecutor(max(1, workers)) as pool:
        verdicts = list(pool.map(verdict, chosen))
    survivors = tuple(f for f, v in zip(chosen, verdicts, strict=True) if v is False)
    rejected = sum(v is True for v in verdicts)
    decided = rejected + len(survivors)
    return Strength(
        task.instance_id, rejected / decided if decided else None, rejected, survivors, equivalent,
        sum(v is None for v in verdicts), len(fixes) - len(chosen), time.monotonic() - start,
    )  # fmt: skip


def with_strength(task: Task, measured: Strength) -> Task:
    """`task` carrying its strength and its surviving wrong fixes (for a reader, never the policy)."""
    return replace(task, strength=measured.strength, survivors=tuple(s.to_json() for s in measured.survivors))


def filter_by_strength(tasks: Iterable[Task], min_strength: float, *, measure_missing: bool = True,
                       **options: Any) -> tuple[list[Task], dict[str, str], list[str]]:  # fmt: skip
    """(kept tasks, {instance_id: why dropped}, ids of kept tasks with no strength) for tasks whose
    strength is below `min_strength`. A task's stored strength is used; a task without one is
    measured (`measure_missing`; `options` go to `measure`) and kept carrying it. A task whose
    strength cannot be decided (no wrong fix could be made or graded) is kept and listed."""
    if not 0 <= min_strength <= 1:
        raise EnvError(f"min_strength must be from 0 to 1, got {min_strength}")
    kept, dropped, unmeasured = [], {}, []
    for task in tasks:
        if task.strength is None and not task.survivors and measure_missing:
            task = with_strength(task, measure(task, **options))
        if task.strength is None:
            unmeasured.append(task.instance_id)
            kept.append(task)
        elif task.strength < min_strength:
            dropped[task.instance_id] = (
                f"test strength {task.strength:.2f} < {min_strength}: its tests accept "
                f"{len(task.survivors)} wrong fix{'es' * (len(task.survivors) != 1)}"
            )
        else:
            kept.append(task)
    return kept, dropped, unmeasured
