"""Published SWE-bench records graded end to end on the local backend, as the official harness graded them.

    JAXSWE_CACHE_DIR=/tmp/published-cache .venv/bin/python bench/bench_published.py [--only ID ...]

Every record of tests/data/published/swe_bench_*_real.json[l] whose base commit is stored in
tests/data/published/repos is graded with its gold patch, the empty patch and, where an official
evaluation of a model run is stored (tests/data/published/swe_bench_eval/<run>/<id>), that run's
model patch (cut from the official log), with `envs.grading.grader.grade(task, patch, twins=False)`. Prints
one markdown table row per record: the official verdict, jaxswe's verdicts and the per-test
agreement (with the official report for the model patch; with the record's FAIL_TO_PASS and
PASS_TO_PASS for gold and empty). Task environments are built on first use (pip, network) under
$JAXSWE_CACHE_DIR; an environment that cannot be built is named, never scored.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import tempfile
import time
from pathlib import Path

from envs.grading.grader import GradeResult, grade
from envs.tasks.published import model_patch, official_outcomes, repos_from_bundles
from envs.tasks.records import Task, load_tasks

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "published"
RECORDS = (
    "swe_bench_lite_dev_real.json",
    "swe_bench_dev_real.json",
    "swe_bench_lite_real.json",
    "swe_bench_verified_real.jsonl",
)
HEADER = (
    "| instance | repo | spec Python | official (model) | jaxswe (model) | model tests agreeing | gold "
    "| empty | gold/empty tests as recorded | seconds |\n|---|---|---|---|---|---|---|---|---|---:|"
)


def stored_tasks() -> list[Task]:
    """The published records whose base commit is stored as a bundle, each instance once (the
    first file of RECORDS that holds it)."""
    stored = {b.stem for b in (DATA / "repos").glob("*.bundle")}
    tasks = {}
    for task in (t for name in RECORDS for t in load_tasks(DATA / name)):
        if f"{task.repo.replace('/', '__')}-{task.base_commit[:7]}" in stored:
            tasks.setdefault(task.instance_id, task)
    return list(tasks.values())


def official_run(task: Task) -> tuple[dict, str] | None:
    """(report entry, model patch) of the stored official evaluation of the task, if any."""
    for run in sorted((DATA / "swe_bench_eval").iterdir()):
        found = run / task.instance_id
        if (found / "report.json").is_file():
            report = json.loads((found / "report.json").read_text())[task.instance_id]
            log = gzip.decompress((found / "test_output.txt.gz").read_bytes()).decode()
            return report, model_patch(log, task.base_commit)
    return None


def verdict(result: GradeResult) -> str:
    """resolved / not resolved, or the infrastructure failure with its cause (never a 0)."""
    if result.error:
        return f"infrastructure failure: {result.reason}"
    return "resolved" if result.resolved else "not resolved"


def as_recorded(task: Task, gold: GradeResult, empty: GradeResult) -> str:
    """How many graded tests gold and empty give as the record says (gold: all pass; empty:
    FAIL_TO_PASS fail, PASS_TO_PASS pass), of how many."""
    graded = [*task.fail_to_pass, *task.pass_to_pass]
    if gold.error or empty.error:
        return "-"
    gold_ok = sum(gold.tests.get(t) == "PASSED" for t in graded)
    empty_ok = sum((empty.tests.get(t) == "PASSED") == (t in task.pass_to_pass) for t in graded)
    return f"gold {gold_ok}/{len(graded)}, empty {empty_ok}/{len(graded)}"


def row(task: Task) -> str:
    """The task's table row (grades gold, empty and the official model patch)."""
    start = time.perf_counter()
    gold, empty = grade(task, task.patch, twins=False), grade(task, "", twins=False)
    official, model, agreeing = "no official run stored", "-", "-"
    if (run := official_run(task)) is not None:
        report, patch = run
        official = "resolved" if report["resolved"] else "not resolved"
        graded = grade(task, patch, twins=False)
        model = verdict(graded)
        if not graded.error:
            outcomes = official_outcomes(report)
            same = sum((graded.tests.get(t) == "PASSED") == ok for t, ok in outcomes.items())
            agreeing = f"{same} of {len(outcomes)}"
    seconds = f"{time.perf_counter() - start:.0f}"
    cells = [f"`{task.instance_id}`", task.repo, str(task.install.get("python")), official, model, agreeing,
             verdict(gold), verdict(empty), as_recorded(task, gold, empty), seconds]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="instance ids to grade (default: all)")
    args = parser.parse_args()
    tasks = [t for t in stored_tasks() if args.only is None or t.instance_id in args.only]
    if unknown := sorted(set(args.only or ()) - {t.instance_id for t in tasks}):
        parser.error(f"no stored record with a stored repository: {', '.join(unknown)}")
    with tempfile.TemporaryDirectory(prefix="jaxswe-published-repos-") as repos:
        os.environ["JAXSWE_REPOS_DIR"] = str(
            repos_from_bundles(sorted((DATA / "repos").glob("*.bundle")), Path(repos))
        )
        print(HEADER, flush=True)
        for task in tasks:
            print(row(task), flush=True)


if __name__ == "__main__":
    main()
