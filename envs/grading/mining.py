"""Mining SWE tasks from a git history (SWE-rebench's pipeline, the paper's filters).

For every non-merge commit C with one parent P, in order (each stage's survivors go on):
1. `src+tests`: C changes both test files (envs.tasks.patches.is_test_path, .py) and non-test .py files.
2. `size`: the non-test part (the gold `patch`) changes <= 7 files and < 500 lines.
3. `bug fix, no leak`: the commit message describes a bug fix, not a feature, deprecation or
   chore, and the statement (the merged pull request's text where the history names one, else the
   commit message, without its trailers such as `Signed-off-by:`) gives nothing of the fix away
   (`statement_problem`).
4. `tests ran`: in the task's environment (local sandbox + task venv), the test files C touches run
   (for a touched helper with no tests of its own, such as tests/__init__.py, its directory) at P
   with the test part (`test_patch`) applied ("before") and with both parts ("after"), each `runs`
   times; a run whose test_patch does not apply or reports no test is dropped. The environment
   is the task's own: the recipe installed at the newest change to the packaging files at or
   before P (`environment_commit`), not the repository's tip.
5. `fail-to-pass`: FAIL_TO_PASS = tests not passing before (any run) and passing after (every
   run); PASS_TO_PASS = passing in every run of both; tests whose status differs between runs
   of the same side are flaky and dropped. A task without FAIL_TO_PASS is dropped.
6. `no new API`: a task whose failing tests fail before the fix with ImportError/AttributeError/
   NameError, pytest's "DID NOT WARN" or a deprecation warning is dropped (the fix adds an API or a
   deprecation rather than fixing a bug; argument errors are not taken as a sign: boltons 289edfc fixes one).
7. `valid`: envs.grading.validate.validate_task: gold resolves in every one of `runs` fresh sandboxes,
   the empty patch does not; the gold run's statuses are stored as the task's reference statuses.

Every commit's outcome is appended to a state file as it finishes, with the install recipe it
was examined under, so a rerun resumes where the last one stopped and a rerun with another recipe
re-examines every commit whose outcome depended on the recipe (from `tests ran` on). Commits are
processed by `workers` threads. `drop_summary` says why the dropped commits were dropped, one line
per cause; the written records name their repository portably (`portable_record`).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

from envs.errors import EnvError, TaskError
from envs.grading.grader import grade
from envs.grading.validate import static_reject, validate_task, with_validation
from envs.host_git import git
from envs.tasks.parsers import PASSING
from envs.tasks.patches import is_test_path, patch_files
from envs.tasks.records import Task, task_from_record

STAGES = ("commits", "src+tests", "size", "bug fix, no leak", "tests ran", "fail-to-pass",
          "no new API", "valid")  # fmt: skip
_FIX_WORDS = (
    r"fix(es|ed|ing)?|bugs?|errors?|crash(es|ed)?|incorrect(ly)?|wrong|broken|regression|fails?|failed"
    r"|failures?|rais(e|es|ed|ing)|exceptions?|limitation|\w+(Error|Exception)"
)
_FIX_RE = re.compile(rf"\b({_FIX_WORDS})\b", re.IGNORECASE)
# "Fix #12:", "Fixes #3, fix #4 -", "(#56)": issue references say nothing of what the change is
_ISSUE_REF_RE = re.compile(r"\(?(?:\b(?:fix(?:es|ed)?|close[sd]?|resolve[sd]?)\s+)?#\d+\)?[\s,:;.-]*", re.I)
# a conventional-commit type other than fix ("feat:", "docs(api):", "chore!:"), or a summary that
# calls itself a feature or names a deprecation: not a bug fix, whatever bug words it holds
_FEATURE_RE = re.compile(
    r"^\s*(feat|feature|chore|docs?|refactor|style|test|tests|build|ci|perf|release)(\([^)]*\))?!?:"
    r"|^\s*features?\b|\bdeprecat\w*",
    re.IGNORECASE,
)
# git trailers ("Signed-off-by: A <a@b>", "Change-Id: I12..."): a final paragraph of `Key: value`
# lines; the known keys are removed wherever they stand
_TRAILER_RE = re.compile(r"^[A-Za-z][A-Za-z0-9-]*: \S.*$")
_KNOWN_TRAILER_RE = re.compile(
    r"^(signed-off-by|co-authored-by|change-id|reviewed-by|reviewed-on|acked-by|tested-by|reported-by"
    r"|suggested-by|helped-by|cc): .*$\n?",
    re.IGNORECASE | re.MULTILINE,
)
# a summary led by one of these describes a feature, a deprecation, a refactor or a chore
_NOT_A_FIX_RE = re.compile(
    r"^\s*(add(s|ed)?|implement(s|ed)?|introduce[sd]?|support(s|ed)?|deprecate[sd]?|convert(s|ed)?"
    r"|refactor(s|ed)?|rename[sd]?|remove[sd]?|drop(s|ped)?|update[sd]?|bump(s|ed)?|release[sd]?|prepare[sd]?"
    r"|document(s|ed)?|docs?|cleanup|clean up|style|format|typing|type hints?|new)\b",
    re.IGNORECASE,
)
# failing tests that fail this way test an API the fix adds or a warning it introduces, not a bug
_NEW_API_RE = re.compile(
    r"\b(ImportError|ModuleNotFoundError|AttributeError|NameError|DeprecationWarning|PendingDeprecationWarning"
    r"|FutureWarning)\b|DID NOT WARN"
)
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{3,}")
DEFAULT_INSTALL = {"install": "pip install -e .", "test_cmd": "pytest -rA"}
_PLACEHOLDER = "jaxswe::placeholder"  # a graded id no run reports (grading wants one F2P test)
# outcomes decided before any test ran: the same under every install recipe
_RECIPE_FREE_STAGES = ("commits", "src+tests", "size")


@dataclass(frozen=True)
class Outcome:
    """One commit's result: the last stage it passed, why it stopped, and the task record if kept."""

    commit: str
    stage: str
    reason: str = ""
    record: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"commit": self.commit, "stage": self.stage, "reason": self.reason, "record": self.record}

    @property
    def recipe_free(self) -> bool:
        """Whether the outcome holds under any install recipe (decided before any test ran)."""
        return self.stage in _RECIPE_FREE_STAGES and not self.reason.startswith("error:")

    @property
    def cause(self) -> str:
        """Why the commit was dropped, without the commit's particulars (the reason up to its first ': ')."""
        return self.reason.split(": ", 1)[0]


def repo_name(repo_dir: Path) -> str:
    """owner/name from the origin URL (github style), else `local/<directory name>`."""
    url = git(repo_dir, "config", "--get", "remote.origin.url", check=False).strip()
    m = re.search(r"[:/]([\w.-]+)/([\w.-]+?)(?:\.git)?/?$", url)
    if m and not url.endswith(".bundle"):
        return f"{m.group(1)}/{m.group(2)}"
    return f"local/{repo_dir.resolve().name.removesuffix('.git')}"


def candidate_commits(repo_dir: Path, since: str | None = None, until: str | None = None) -> list[str]:
    """Non-merge commits of HEAD's history, oldest first (optionally `--since` / `--until` dates)."""
    args = ["rev-list", "--no-merges", "--reverse", *([f"--since={since}"] if since else []),
            *([f"--until={until}"] if until else []), "HEAD"]  # fmt: skip
    return git(repo_dir, *args).split()


def split_commit(repo_dir: Path, commit: str) -> tuple[str, str, str] | None:
    """(parent, patch, test_patch) of a commit changing .py tests and .py non-test files, else None."""
    parents = git(repo_dir, "rev-list", "--parents", "-n", "1", commit).split()[1:]
    if len(parents) != 1:
        return None
    files = git(repo_dir, "diff", "--name-only", "--no-renames", parents[0], commit).split("\n")
    files = [f for f in files if f]
    tests = [f for f in files if is_test_path(f)]
    source = [f for f in files if f not in tests]
    if not any(f.endswith(".py") for f in tests) or not any(f.endswith(".py") for f in source):
        return None
    diff = ["diff", "--no-renames", "--binary", parents[0], commit, "--"]
    return parents[0], git(repo_dir, *diff, *source), git(repo_dir, *diff, *tests)


def statement_problem(
    statement: str, patch: str, known: Callable[[set[str]], set[str]], message: str | None = None
) -> str:
    """Why `statement` is no task statement ('' when it is one): the commit `message` (default: the
    statement itself) does not describe a bug fix
    (no fix/bug/error/raise/...Error/... word, or a summary that, past its issue references, leads
    with add/deprecate/convert/refactor/... and names no bug: features, refactors and releases are
    not bugs to find), or it gives the fix away (an added line of the patch verbatim, or a code-like name the
    patch adds that the repository did not have before it; `known(names)` says which it had)."""
    message = statement if message is None else message
    summary = _ISSUE_REF_RE.sub(" ", message.strip().splitlines()[0]).strip()
    if _FEATURE_RE.search(summary):
        return f"the commit message describes a feature or deprecation, not a bug fix: {summary[:80]!r}"
    if not _FIX_RE.search(message):
        return "the commit message does not describe a bug fix"
    if _NOT_A_FIX_RE.match(summary) and not _FIX_RE.search(summary):
        return f"the commit message describes a feature or chore, not a bug fix: {summary[:80]!r}"
    added = [ln[1:].strip() for ln in patch.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    for line in added:
        if len(line) >= 12 and line in statement:
            return f"the statement gives the fix away: {line!r}"
    named = {w for ln in added for w in _IDENT_RE.findall(ln)} & set(_IDENT_RE.findall(statement))
    named = {w for w in named if "_" in w or w[1:] != w[1:].lower() or re.search(rf"\b{w}\(", statement)}
    if new := sorted(named - known(named)):  # code-like names (snake_case, CamelCase, called), not prose
        return f"the statement names what the fix adds: {new[0]}"
    return ""


def strip_trailers(message: str) -> str:
    """A commit message without its git trailers: the known keys (Signed-off-by, Co-authored-by,
    Change-Id, Reviewed-by, ...) wherever they stand, a rule (`---`) they leave at the end, and a
    final paragraph of `Key: value` lines (never the summary paragraph)."""
    text = re.sub(r"(\n\s*-{3,}\s*)+$", "", _KNOWN_TRAILER_RE.sub("", message).strip())  # a bare rule left
    paragraphs = re.split(r"\n\s*\n", text)
    if len(paragraphs) > 1 and all(_TRAILER_RE.match(ln) for ln in paragraphs[-1].strip().splitlines()):
        paragraphs = paragraphs[:-1]
    return "\n\n".join(paragraphs).strip()


def pull_request_text(repo_dir: Path, commit: str, *, scan: int = 50) -> str | None:
    """The title and description of the pull request that brought `commit` in: the message of the
    first merge after it whose first parent does not hold it, past its `Merge pull request #N from`
    line (GitHub's merge commits); None when the history names no pull request for it."""
    merges = git(repo_dir, "rev-list", "--ancestry-path", "--merges", "--reverse", f"{commit}..HEAD").split()
    for merge in merges[:scan]:
        if git(repo_dir, "merge-base", commit, f"{merge}^1", check=False).strip() == commit:
            continue  # merged before, along the first parent
        head, _, text = git(repo_dir, "log", "-1", "--format=%B", merge).strip().partition("\n")
        m = re.match(r"Merge pull request (#\d+)", head)
        text = strip_trailers(text)
        return f"{text}\n\n(pull request {m.group(1)})" if m and text else None
    return None


def environment_commit(repo_dir: Path, commit: str) -> str:
    """The commit whose packaging files (setup.py, setup.cfg, pyproject.toml, requirements*.txt) a
    task at `commit` installs from: the newest change to them at or before it (tasks between two
    such changes share one environment), else `commit` itself."""
    files = ["setup.py", "setup.cfg", "pyproject.toml", ":(glob)requirements*.txt"]
    return git(repo_dir, "log", "-1", "--format=%H", commit, "--", *files).strip() or commit


def _known_names(repo_dir: Path, commit: str) -> Callable[[set[str]], set[str]]:
    """Which of some names occur (as words) anywhere in the repository at `commit`."""

    def known(names: set[str]) -> set[str]:
        if not names:
            return set()
        patterns = [arg for name in sorted(names) for arg in ("-e", name)]
        found = git(repo_dir, "grep", "-h", "-o", "-w", "-I", *patterns, commit, "--", check=False)
        return set(found.split()) & names

    return known


def test_directives(test_patch: str) -> list[str]:
    """What the tests of a commit's test part run: each test module it touches, and for a touched
    helper that holds no tests itself (tests/__init__.py with a shared mixin, conftest.py, a data
    file) the directory of tests that use it."""
    modules, dirs = [], []
    for path in patch_files(test_patch):
        name = PurePosixPath(path).name
        if name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py")):
            modules.append(path)
        else:
            dirs.append(str(PurePosixPath(path).parent))
    dirs = sorted(set(dirs))
    inside = lambda p: any(d == "." or p.startswith(d + "/") for d in dirs)  # noqa: E731
    return [*dirs, *(m for m in dict.fromkeys(modules) if not inside(m))]


def _runs(task: Task, patch: str, runs: int, **limits: Any) -> list[dict[str, str]] | str:
    """Statuses of `runs` test runs with `patch` (+ test_patch), or why they could not run."""
    results = []
    for _ in range(runs):
        graded = grade(task, patch, "local", **limits)
        if graded.error or graded.reason.startswith("patch does not apply"):
            return graded.reason
        tests = {t: s for t, s in graded.tests.items() if t != _PLACEHOLDER}
        if not tests:
            return f"the test run reported no tests: {log_gist(graded.log)}"
        results.append((tests, graded.messages))
    return results


def log_gist(log: str) -> str:
    """The line of a test log that says most about why it ran no test: the last one naming an error
    (`ModuleNotFoundError: No module named 'hypothesis'`), else the last line; at most 200 characters."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.search(r"\w(Error|Exception)\b|\berror\b|No module named", ln, re.I)]
    return (errors or lines or ["(no output)"])[-1][:200]


def _stable(runs: list[tuple[dict[str, str], dict[str, str]]]) -> dict[str, str]:
    """Tests with the same status in every run (flaky ones dropped)."""
    first = runs[0][0]
    return {t: s for t, s in first.items() if all(r[0].get(t) == s for r in runs[1:])}


def mine_commit(
    repo_dir: Path, commit: str, *, name: str, install: dict[str, Any], runs: int = 3,
    max_files: int = 7, max_lines: int = 500, check_statement: bool = True, **limits: Any,
) -> Outcome:  # fmt: skip
    """Run one commit through the stages (see the module docstring); `check_statement=False` skips
    the `bug fix, no leak` stage (a commit mined for its tests, not as an RL task). The statement is
    the pull request's text where the history names one, else the commit message; the environment
    is the task's own (`environment_commit`)."""
    split = split_commit(repo_dir, commit)
    if split is None:
        return Outcome(commit, "commits", "does not change both .py tests and .py source")
    parent, patch, test_patch = split
    message = git(repo_dir, "log", "-1", "--format=%B", commit).strip()
    record = {
        "instance_id": f"{name.replace('/', '__')}-{commit[:10]}",
        "repo": name,
        "base_commit": parent,
        "patch": patch,
        "test_patch": test_patch,
        "problem_statement": pull_request_text(repo_dir, commit) or strip_trailers(message),
        "FAIL_TO_PASS": [_PLACEHOLDER],
        "PASS_TO_PASS": [],
        "install_config": install,
        "environment_setup_commit": environment_commit(repo_dir, parent),
        "created_at": git(repo_dir, "log", "-1", "--format=%cI", commit).strip(),
        "source_dir": str(repo_dir.resolve()),
        "mined_from": commit,
        "test_directives": test_directives(test_patch),
    }
    task = task_from_record(record)
    if why := static_reject(task, max_files=max_files, max_lines=max_lines):
        return Outcome(commit, "src+tests", f"gold patch too large: {why}")
    if check_statement and (
        why := statement_problem(record["problem_statement"], patch, _known_names(repo_dir, parent), message)
    ):
        return Outcome(commit, "size", why)
    before = _runs(task, "", runs, **limits)
    after = _runs(task, patch, runs, **limits) if not isinstance(before, str) else before
    if isinstance(before, str) or isinstance(after, str):
        why = before if isinstance(before, str) else after
        return Outcome(commit, "bug fix, no leak", f"tests did not run: {why}")
    stable_after = _stable(after)
    stable_before = _stable(before)
    f2p = sorted(
        t for t, s in stable_after.items()
        if s in PASSING and all(r[0].get(t, "MISSING") not in PASSING for r in before)
    )  # fmt: skip
    p2p = sorted(t for t, s in stable_after.items() if s in PASSING and stable_before.get(t) in PASSING)
    if not f2p:
        return Outcome(commit, "tests ran", "no test fails before and passes after (or only flaky ones)")
    messages = " ".join(m for r in before for m in r[1].values())
    if m := _NEW_API_RE.search(messages):
        return Outcome(commit, "fail-to-pass", f"the failing tests test a new API or warning: {m.group(0)}")
    task = replace(task, fail_to_pass=tuple(f2p), pass_to_pass=tuple(p2p))
    record = {**task.to_record(), "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p}
    task = task_from_record(record)
    check = validate_task(task, runs=runs, backend="local", **limits)
    if not check.ok:
        return Outcome(commit, "no new API", check.reason)
    return Outcome(commit, "valid", "", with_validation(task, check).to_record())


def recipe_key(install: dict[str, Any]) -> str:
    """The install recipe as the state file records it (canonical JSON)."""
    return json.dumps(install, sort_keys=True)


def read_state(path: Path) -> dict[tuple[str, str], Outcome]:
    """Outcomes recorded so far by (commit, recipe key); the key is "" for an outcome that holds under
    any recipe (`Outcome.recipe_free`). A torn last line from a killed run is ignored, and so is a row
    of an older state file that recorded no recipe for a recipe-dependent outcome."""
    done: dict[tuple[str, str], Outcome] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
                outcome = Outcome(row["commit"], row["stage"], row["reason"], row["record"])
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
            recipe = "" if outcome.recipe_free else row.get("recipe")
            if recipe is not None:
                done[(outcome.commit, recipe)] = outcome
    return done


def stage_counts(outcomes: list[Outcome], scanned: int) -> dict[str, int]:
    """How many commits reached each stage (the yield of every filter)."""
    reached = Counter(STAGES.index(o.stage) for o in outcomes)
    counts = {"commits": scanned}
    for i, stage in enumerate(STAGES[1:], 1):
        counts[stage] = sum(n for k, n in reached.items() if k >= i)
    return counts


def drop_summary(outcomes: list[Outcome]) -> list[str]:
    """One line per cause of the dropped commits, most frequent first: the count, the cause, and for
    a cause whose particulars differ per commit the newest commit's as an example."""
    dropped = [o for o in outcomes if o.record is None]
    lines = []
    for cause, n in Counter(o.cause for o in dropped).most_common():
        last = [o for o in dropped if o.cause == cause][-1]
        detail = last.reason[len(cause) + 2 :].strip()
        example = f" (e.g. {last.commit[:10]}: {' '.join(detail.split())[:200]})" if detail else ""
        lines.append(f"{n:6d}  {cause}{example}")
    return lines


def portable_record(record: dict[str, Any], repo_dir: Path, out: Path) -> dict[str, Any]:
    """The record as written to the task file `out`: no `source_dir` when the repository is the
    task's `$JAXSWE_REPOS_DIR/<owner>__<name>` clone, else `source_dir` relative to `out`'s directory
    (`load_tasks` resolves it from there), so the task file and its repository move together."""
    record = dict(record)
    repo_dir = repo_dir.resolve()
    clone = task_from_record(record).repos_dir_clone()
    if clone is not None and clone.resolve() == repo_dir:
        record.pop("source_dir", None)
    else:
        record["source_dir"] = os.path.relpath(repo_dir, out.resolve().parent)
    return record


def mine(repo_dir: str | Path, out: str | Path, **options: Any) -> dict[str, int]:
    """Mine `repo_dir` into the JSONL file `out` (state in `out`.state.jsonl); returns stage counts.
    `options` are `mine_outcomes`'s."""
    return stage_counts(*mine_outcomes(repo_dir, out, **options))


def mine_outcomes(
    repo_dir: str | Path, out: str | Path, *, since: str | None = None, until: str | None = None,
    name: str | None = None, install: dict[str, Any] | None = None, runs: int = 3, workers: int = 1,
    limit: int | None = None, on_outcome: Callable[[Outcome], None] | None = None, **limits: Any,
) -> tuple[list[Outcome], int]:  # fmt: skip
    """Mine `repo_dir` into the JSONL file `out` (state in `out`.state.jsonl): (each commit's outcome,
    oldest first; the number of commits scanned). Outcomes the state file holds under this recipe (or
    under any, for those decided before tests ran) are not redone."""
    repo_dir, out = Path(repo_dir), Path(out)
    if not (repo_dir / ".git").exists() and not (repo_dir / "HEAD").is_file():
        raise TaskError(f"{repo_dir} is not a git repository")
    if runs < 1 or workers < 1:
        raise EnvError(f"runs and workers must be >= 1, got {runs} and {workers}")
    name = name or repo_name(repo_dir)
    install = install or DEFAULT_INSTALL
    recipe = recipe_key(install)
    commits = candidate_commits(repo_dir, since, until)
    commits = commits[-limit:] if limit else commits
    state_path = out.with_name(out.name + ".state.jsonl")
    state = read_state(state_path)
    done = {c: state.get((c, "")) or state.get((c, recipe)) for c in commits}
    todo = [c for c in commits if done[c] is None]
    lock = threading.Lock()

    def work(commit: str) -> Outcome:
        try:
            outcome = mine_commit(repo_dir, commit, name=name, install=install, runs=runs, **limits)
        except (EnvError, OSError) as err:  # one commit's failure (a vanished sandbox) ends only it
            outcome = Outcome(commit, "size", f"error: {type(err).__name__}: {err}")
        with lock:
            with state_path.open("a") as f:
                f.write(json.dumps({**outcome.to_json(), "recipe": recipe}) + "\n")
            done[commit] = outcome
        if on_outcome is not None:
            on_outcome(outcome)
        return outcome

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(work, todo))
    outcomes = [done[c] for c in commits]
    kept = [portable_record(o.record, repo_dir, out) for o in outcomes if o.record is not None]
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    tmp.replace(out)
    return outcomes, len(commits)
