"""Published SWE-bench records and their recorded evaluations, read as the official harness wrote them.

- `repos_from_bundles`: the repositories of published records from git bundles of their base
  commits' trees only (`<owner>__<name>-<commit>.bundle`), as `$JAXSWE_REPOS_DIR` wants them.
- `model_patch`: the patch an official evaluation graded, cut from its log (the eval script prints
  `git diff <base>` with the patch applied).
- `official_outcomes`: each graded test of an official `report.json`, passed or not.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path

from envs.errors import SandboxError
from envs.host_git import host_env


def model_patch(log: str, base_commit: str) -> str:
    """The patch the official eval script graded: its `git diff <base>` output in the log (up to the
    script's next command, which re-activates conda)."""
    lines = log.splitlines()
    start = lines.index(f"+ git -c core.fileMode=false diff {base_commit}") + 1
    end = lines.index("+ source /opt/miniconda3/bin/activate", start)
    return "\n".join(lines[start:end]) + "\n"


def official_outcomes(report: dict) -> dict[str, bool]:
    """Each graded test of the official report (one instance's entry): passed or not."""
    statuses = report["tests_status"]
    return {t: ok == "success" for kind in ("FAIL_TO_PASS", "PASS_TO_PASS") for ok in ("success", "failure")
            for t in statuses[kind][ok]}  # fmt: skip


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], capture_output=True, text=True, env=host_env())
    if done.returncode != 0:
        raise SandboxError(f"git {' '.join(args)} failed: {done.stderr.strip()[-300:]}")
    return done.stdout


def repos_from_bundles(bundles: Iterable[Path], into: Path) -> Path:
    """One bare repository per `<owner>__<name>` under `into` holding every head of that
    repository's bundles (`<owner>__<name>-<commit>.bundle`); each head is named in the
    repository's `shallow` file (the bundles store no parents). Returns `into`, for
    `$JAXSWE_REPOS_DIR`."""
    for bundle in map(Path.resolve, bundles):
        name, commit = bundle.stem.rsplit("-", 1)
        heads = [line.split()[0] for line in _git("bundle", "list-heads", str(bundle)).splitlines()]
        repo = into / name
        if not repo.is_dir():
            _git("init", "-q", "--bare", str(repo))
        shallow = repo / "shallow"
        known = shallow.read_text().split() if shallow.is_file() else []
        shallow.write_text("".join(f"{c}\n" for c in dict.fromkeys([*known, *heads])))
        _git("-C", str(repo), "fetch", "-q", str(bundle), f"refs/heads/*:refs/heads/{commit}/*")
    return into
