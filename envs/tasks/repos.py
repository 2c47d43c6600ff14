"""Clean repositories: a task's repo at base_commit with no trace of anything after it.

`clean_template(task)` builds (once, cached under `$JAXSWE_CACHE_DIR/templates`) a git repository
whose only ref is `main` at base_commit: fetched by commit id into an empty repository, so no
later commits, tags, remotes, reflog or FETCH_HEAD come along. Sandboxes copy this template.

Git runs through envs.host_git: never depending on the caller's config or GIT_* variables.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from envs.errors import SandboxError
from envs.host_git import cache_dir, git, host_env

if TYPE_CHECKING:
    from envs.tasks.records import Task


def task_source(task: Task) -> Path:
    """The git repository a task's base_commit is fetched from (clear error naming where it looked)."""
    if task.source_dir is not None:
        path = Path(task.source_dir)
        if not (path / ".git").exists() and not (path / "HEAD").exists():
            raise SandboxError(f"task {task.instance_id}: {path} is not a git repository")
        return path
    path = task.repos_dir_clone(missing_ok=True)
    if not path.is_dir():
        raise SandboxError(
            f"task {task.instance_id}: no local clone of {task.repo}; looked in {path} "
            f"(set JAXSWE_REPOS_DIR, or use the docker backend with the task's image)"
        )
    return path


def clean_template(task: Task) -> Path:
    """The cached clean repository of a task (built atomically; safe from many threads/processes)."""
    final = cache_dir() / "templates" / f"{task.instance_id.replace('/', '__')}-{task.base_commit[:16]}"
    if (final / ".git").is_dir():
        return final
    source = task_source(task)
    tmp = final.parent / f".tmp-{uuid.uuid4().hex}"
    tmp.mkdir(parents=True)
    try:
        git(tmp, "init", "-q", "-b", "main")
        fetched = subprocess.run(
            ["git", "-C", str(tmp), "-c", "uploadpack.allowAnySHA1InWant=true", "fetch", "-q", "--no-tags",
             str(source.resolve()), task.base_commit],
            capture_output=True, text=True, env=host_env(),
        )  # fmt: skip
        if fetched.returncode != 0:
            raise SandboxError(
                f"task {task.instance_id}: commit {task.base_commit} not found in {source}: "
                f"{fetched.stderr.strip()[-300:]}"
            )
        git(tmp, "update-ref", "refs/heads/main", task.base_commit)
        git(tmp, "reset", "-q", "--hard", "main")
        (tmp / ".git" / "FETCH_HEAD").unlink(missing_ok=True)
        git(tmp, "reflog", "expire", "--expire=now", "--all")
        git(tmp, "config", "user.name", "jaxswe")
        git(tmp, "config", "user.email", "jaxswe@localhost")
        try:
            tmp.rename(final)
        except OSError:  # another thread or process finished first
            if not (final / ".git").is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
