"""The built-in task suite's repositories: `envs/tasks/builtin/<instance_id>/{task.json, repo/}`
(`envs.tasks.records.load_builtin` reads the records).

Each task's `repo/` is materialized as a git repository with ONE commit made with fixed author,
committer, dates and config, so its hash (the task's base_commit) is the same on every machine.
Materialized repositories are cached under `$JAXSWE_CACHE_DIR/builtin` by a hash of the files.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from pathlib import Path

from envs.errors import TaskError
from envs.host_git import cache_dir, git

BUILTIN_DIR = Path(__file__).parent / "builtin"
_FIXED_DATE = "2025-01-01T00:00:00+0000"
_COMMIT_ENV = {"GIT_AUTHOR_DATE": _FIXED_DATE, "GIT_COMMITTER_DATE": _FIXED_DATE}


def _files_digest(repo: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in repo.rglob("*") if p.is_file() or p.is_symlink()):
        rel = path.relative_to(repo).as_posix()
        if "__pycache__" in rel or rel.endswith(".pyc"):
            continue
        mode = "l" if path.is_symlink() else ("x" if os.access(path, os.X_OK) else "f")
        data = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
        digest.update(f"{rel}\0{mode}\0{len(data)}\0".encode() + data)
    return digest.hexdigest()[:16]


def materialize(task_dir: Path) -> tuple[Path, str]:
    """(git repository of `task_dir/repo` with one deterministic commit, that commit's hash)."""
    files = task_dir / "repo"
    if not files.is_dir():
        raise TaskError(f"built-in task {task_dir.name}: {files} is missing")
    final = cache_dir() / "builtin" / f"{task_dir.name}-{_files_digest(files)}"
    if not (final / ".git").is_dir():
        tmp = final.parent / f".tmp-{uuid.uuid4().hex}"
        shutil.copytree(
            files, tmp, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".git")
        )
        try:
            git(tmp, "init", "-q", "-b", "main")
            git(tmp, "-c", "core.autocrlf=false", "-c", "core.fileMode=true", "add", "-A", "-f", ".")
            git(
                tmp,
                "-c",
                "commit.gpgsign=false",
                "commit",
                "-q",
                "--no-verify",
                "-m",
                "base",
                env=_COMMIT_ENV,
            )
            try:
                tmp.rename(final)
            except OSError:
                if not (final / ".git").is_dir():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final, git(final, "rev-parse", "HEAD").strip()


def builtin_source(instance_id: str, base_commit: str, task_dir: str | None = None) -> str:
    """The materialized repository of a built-in task, checked against the record's base_commit."""
    path = Path(task_dir) if task_dir else BUILTIN_DIR / instance_id
    if not (path / "repo").is_dir():
        raise TaskError(f"built-in task {instance_id}: no repository at {path / 'repo'}")
    repo_dir, commit = materialize(path)
    if commit != base_commit:
        raise TaskError(
            f"built-in task {instance_id}: base_commit {base_commit} != {commit} of {path / 'repo'}"
        )
    return str(repo_dir)
