"""Host-side git that never depends on the caller: no user or system config, none of the caller's
GIT_* variables (GIT_DIR, GIT_WORK_TREE, GIT_INDEX_FILE from a git hook or a shell would point git at
another repository), and a call that reads no repository runs in a fresh empty directory
(`git_outside()`), never in the caller's working directory (in a work tree's subdirectory, `git apply`
keeps only the paths under it: every patch would touch nothing). Also the cache dir all of envs uses.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from envs.errors import SandboxError

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
