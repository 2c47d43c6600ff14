"""`open_sandbox(task, backend)`: a fresh sandbox at the task's clean base state.

local: a copy of the task's clean template repository (see envs.tasks.repos), its commands run with
the task's virtualenv (envs.provision.venvs), never the host's site-packages. docker: the task's image
(its SWE image when the engine has it, cleaned of later history once and cached as a derived
image; else the base image + the clean repository). In neither is there test_patch, the gold
patch, the test lists or any commit, tag, remote or reflog entry after base_commit.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from envs.errors import SandboxError

if TYPE_CHECKING:
    from envs.sandbox.protocol import Sandbox
    from envs.tasks.records import Task

BACKENDS = ("local", "docker")


def isolation(backend: str) -> tuple[str, bool]:
    """(how model commands are isolated on `backend`, in words; whether they are isolated at all)."""
    if backend == "docker":
        return "docker: a container per episode (no network, memory/CPU/pids limits, own deadline)", True
    from envs.sandbox.local import bwrap_available

    if bwrap_available():
        return (
            "local: bubblewrap (own pid/mount/net/ipc/uts namespaces, no capabilities, unprivileged uid, "
            "rlimits; as root a memory cgroup and a size-capped tmpfs; only the episode's checkout is "
            "visible)",
            True,
        )
    return "local: NONE (bubblewrap is not installed: model commands run on this host as this user)", False


def reap(backend: str) -> list[str]:
    """Remove what dead predecessors left: local sandbox directories (always), containers (docker)."""
    from envs.sandbox.local import reap_sandboxes

    removed = reap_sandboxes()
    if backend == "docker":
        from envs.provision.engines import default_pool
        from envs.sandbox.docker_sandbox import reap_containers

        pool = default_pool()
        removed += pool.reap() if pool is not None else reap_containers()  # every engine of the pool
    return removed


def open_sandbox(
    task: Task, backend: str = "local", stop: threading.Event | None = None, **limits: Any
) -> Sandbox:
    """A new sandbox of `task` (limits: timeout, output_limit, and per backend e.g. pids_limit).

    docker: on `client` when given, else from `pool` (an envs.provision.engines.EnginePool) or the process's
    default pool when one is configured (env.docker_hosts), else on the DOCKER_HOST engine. A pooled
    open that waits for a free slot gives up (EngineError) once `stop` is set."""
    if backend == "local":
        from envs.provision.venvs import venv_binds, venv_env
        from envs.sandbox.local import LocalSandbox
        from envs.tasks.repos import clean_template

        template = clean_template(task)
        env = {**venv_env(task, template), **limits.pop("env", {})}
        return LocalSandbox(template, env=env, ro_binds=venv_binds(task), host_python=False, **limits)
    if backend == "docker":
        from envs.provision.engines import default_pool
        from envs.provision.images import task_image
        from envs.sandbox.docker_sandbox import DockerSandbox, _client

        pool = limits.pop("pool", None)
        if limits.get("client") is None and (pool or default_pool()) is not None:
            limits.pop("client", None)
            return (pool or default_pool()).open(task, stop=stop, **limits)
        client = _client(limits.pop("client", None))
        image, shell_init = task_image(task, client=client)
        return DockerSandbox(image, workdir=task.workdir, shell_init=shell_init, client=client, **limits)
    raise SandboxError(f"unknown sandbox backend {backend!r} (choose from {', '.join(BACKENDS)})")
