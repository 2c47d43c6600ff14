"""`jaxswe sandboxes reap`: remove sandboxes (local directories and their processes, Docker sandbox
and build containers) whose owner process is gone, as every stage does when it starts (`--config`:
on every engine of its env.docker_hosts)."""

from __future__ import annotations

import typer

from jaxswe.errors import UserError


def reap(
    docker: bool = typer.Option(True, "--docker/--no-docker", help="also reap Docker containers"),
    config: str | None = typer.Option(
        None,
        "--config",
        help="reap every Docker engine of this config's env.docker_hosts (default: DOCKER_HOST)",
    ),
) -> None:
    """Remove what dead runs left behind; prints one line per removed sandbox."""
    import sys

    from envs.errors import SandboxError
    from envs.sandbox.local import reap_sandboxes

    removed = reap_sandboxes()
    hosts = []
    if docker and config is not None:
        from jaxswe.config import load_config

        hosts = [h.model_dump() for h in load_config(config).env.docker_hosts]
    if hosts:
        from envs.provision.engines import EnginePool

        try:
            pool = EnginePool(hosts, health_interval_s=0)
            try:
                removed += pool.reap()
            finally:
                pool.close()
        except SandboxError as err:
            raise UserError(str(err)) from None
        for e in pool.engines:
            if not e.healthy:
                print(f"Docker engine {e.name} does not answer: not reaped", file=sys.stderr)
    elif docker:
        from envs.sandbox.docker_sandbox import engine_available, reap_containers

        if engine_available():
            try:
                removed += reap_containers()
            except SandboxError as err:
                raise UserError(str(err)) from None
    for name in removed:
        print(name)
    print(f"removed {len(removed)} sandboxes")


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="Local and Docker sandboxes.", no_args_is_help=True)
    group.command("reap")(reap)
    app.add_typer(group, name="sandboxes")
