"""Errors of the environment layer; the CLI shows their message as one line."""


class EnvError(Exception):
    """Base of every user-facing envs error."""


class TaskError(EnvError):
    """A task record or task file that cannot be used (the message names index, id and field)."""


class SandboxError(EnvError):
    """A sandbox that cannot be started or used (missing repo/commit/image, dead engine)."""


class EngineError(EnvError):
    """A Docker engine failed (does not answer, dropped a call): an infrastructure failure, never the
    policy's. Deliberately not a SandboxError, which callers may treat as the policy's doing."""
