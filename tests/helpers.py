"""Small helpers the tests share: the suite's locations, the environment of a user's `jaxswe`
process, a free local port and git in a repository."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

TESTS = Path(__file__).resolve().parent  # tests/: these helpers, conftest.py and the child scripts
ROOT = TESTS.parent  # the checkout
DATA = TESTS / "data"
REPOS = ROOT.parent / "shared" / "repos"  # ../shared beside the checkout (CI too)


def user_env() -> dict[str, str]:
    """The environment of a `jaxswe` process run as a user runs it: one CPU device, none of the
    suite's XLA flags (conftest.py)."""
    return {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that no one listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def git(repo: str | Path, *args: str, input: str | None = None) -> str:
    """`git -C repo ARGS`; its stdout (a failure raises CalledProcessError)."""
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, input=input
    ).stdout
