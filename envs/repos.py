"""Clean repositories: a task's repo at base_commit with no trace of anything after it.

`clean_template(task)` builds (once, cached under `$JAXSWE_CACHE_DIR/templates`) a git repository
whose only ref is `main` at base_commit: fetched by commit id into an empty repository, so no
later commits, tags, remotes, reflog or FETCH_HEAD come along. Sandboxes copy this template.

Host-side git (`git()`, `host_env()`: here, envs.builtin, envs.mining, envs.venvs, envs.patches)
never depends on the caller: no user or system config, none of the caller's GIT_* variables
(GIT_DIR, GIT_WORK_TREE, GIT_INDEX_FILE from a git hook or a shell would point git at another
repository), and a call that reads no repository runs in a fresh empty directory (`git_outside()`),
never in the caller's working directory (in a work tree's subdirectory, `git apply` keeps only the
paths under it: every patch would touch nothing).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from envs.errors import SandboxError

if TYPE_CHECKING:
    from envs.tasks import Task

# Git runs with no user/system config, so results do not depend on the machine.
GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_AUTHOR_NAME": "jaxswe",
    "GIT_AUTHOR_EMAIL": "jaxswe@localhost",
    "GIT_COMMITTER_NAME": "jaxswe",
    "GIT_COMMITTER_EMAIL": "jaxswe@localhost",
}


def host_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a host-side git call: the caller's without its GIT_* variables, plus GIT_ENV."""
    own = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return {**own, **GIT_ENV, **(extra or {})}


def git_outside(*args: str, input: bytes) -> subprocess.CompletedProcess:
    """git `args` that read no repository (`apply --numstat`), run in a fresh empty directory
    whose parent is a ceiling (GIT_CEILING_DIRECTORIES): never inside the caller's work tree."""
    with tempfile.TemporaryDirectory(prefix="jaxswe-git-") as tmp:
        ceiling = {"GIT_CEILING_DIRECTORIES": str(Path(tmp).parent)}
        return subprocess.run(
            ["git", *args], input=input, capture_output=True, cwd=tmp, env=host_env(ceiling)
        )


def cache_dir() -> Path:
    return Path(os.environ.get("JAXSWE_CACHE_DIR", Path.home() / ".cache" / "jaxswe"))


def git(repo: Path, *args: str, env: dict[str, str] | None = None, check: bool = True) -> str:
    """Run git in `repo` with a machine-independent config; returns stdout."""
    done = subprocess.run(
        ["git", "-C", str(repo), *args],
        capture_output=True,
        text=True,
        env=host_env(env),
    )
    if check and done.returncode != 0:
        raise SandboxError(f"git {' '.join(args[:3])} failed in {repo}: {done.stderr.strip()[-500:]}")
    return done.stdout


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
