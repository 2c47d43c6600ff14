"""`jaxswe sandboxes reap`: remove sandboxes (local directories and their processes, Docker sandbox
and build containers) whose owner process is gone, as every stage does when it starts."""

from __future__ import annotations

import typer

from jaxswe.errors import UserError


def reap(
    docker: bool = typer.Option(True, "--docker/--no-docker", help="also reap Docker containers"),
) -> None:
    """Remove what dead runs left behind; prints one line per removed sandbox."""
    from envs.errors import SandboxError
    from envs.local import reap_sandboxes

    removed = reap_sandboxes()
    if docker:
        from envs.docker_sandbox import engine_available, reap_containers

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
