"""A universal forgery on every built-in task: how many it gets paid for, with and without the twin run.

    .venv/bin/python bench/bench_forgery.py [--backend local] [--tasks 32] [--workers 2]

The payload (about 20 lines appended to the package's `__init__.py` of each task, the package the
gold patch changes) wraps pytest's `Function.runtest`: a test whose source holds a must-fail
canary's `== <9 digits>` runs honestly, every other test passes whatever it raises. It reads the
test files, so it gets past every canary; only the twin run (envs.tasks.twins) can tell it from a fix.
Prints one JSON line per task and a summary: resolved with the twin run (must be 0), resolved
without it (the canaries alone), and how many were flagged `forged result`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from envs import grade
from envs.grading.grader import FORGED
from envs.tasks.patches import patch_files
from envs.tasks.records import load_builtin
from envs.tasks.repos import clean_template

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_grading_twins import SPARES_CANARIES as PAYLOAD  # noqa: E402  (the suite's own payload)


def forged_patch(task, tmp: Path) -> str:
    """The diff a policy would submit: the payload appended to the gold patch's package."""
    package = patch_files(task.patch)[0].split("/")[0]
    repo = tmp / task.instance_id
    shutil.copytree(clean_template(task), repo, symlinks=True)
    init = repo / package / "__init__.py"
    init.write_text(init.read_text() + PAYLOAD)
    run = {"cwd": repo, "capture_output": True, "text": True, "check": True}
    subprocess.run(["git", "add", "-A", "-f"], **run)
    return subprocess.run(["git", "diff", "--cached", "--binary", "HEAD"], **run).stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="local")
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    tasks = load_builtin()[: args.tasks]
    with tempfile.TemporaryDirectory(prefix="jaxswe-bench-forgery-") as tmp:
        patches = {t.instance_id: forged_patch(t, Path(tmp)) for t in tasks}

    def one(task):
        patch = patches[task.instance_id]
        with_twins, without = grade(task, patch, args.backend), grade(task, patch, args.backend, twins=False)
        row = {"task": task.instance_id, "resolved": with_twins.resolved,
               "flagged": FORGED in with_twins.tamper, "resolved_without_twins": without.resolved,
               "reason": with_twins.reason[:120]}  # fmt: skip
        print(json.dumps(row), flush=True)
        return row

    with ThreadPoolExecutor(args.workers) as pool:
        rows = list(pool.map(one, tasks))
    print(json.dumps({
        "figure": "a universal forgery past the canaries", "backend": args.backend, "tasks": len(rows),
        "resolved": sum(r["resolved"] for r in rows), "flagged": sum(r["flagged"] for r in rows),
        "resolved_without_twin_run": sum(r["resolved_without_twins"] for r in rows),
    }))  # fmt: skip
    sys.exit(1 if any(r["resolved"] for r in rows) else 0)


if __name__ == "__main__":
    main()
