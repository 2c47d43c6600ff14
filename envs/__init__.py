"""Sandboxes (local, Docker), SWE tasks, grading, task validation and filters, toy environments.

This package never imports `jaxswe`; importing it needs only the standard library (the `docker`
SDK is imported when a Docker sandbox is used).
"""

from envs.base import ENDED_ERROR, ENDED_SUBMITTED, Environment, Step
from envs.errors import EngineError, EnvError, SandboxError, TaskError
from envs.grading.grader import GradeResult, grade
from envs.grading.validate import Validation, filter_tasks, validate_task
from envs.provision.backends import BACKENDS, open_sandbox
from envs.provision.images import BASE_IMAGE, build_base_image, build_task_image
from envs.sandbox.docker_sandbox import DockerSandbox, reap_containers
from envs.sandbox.local import LocalSandbox
from envs.sandbox.protocol import ExecResult, Sandbox
from envs.tasks.records import Task, load_tasks

__all__ = [
    "BACKENDS",
    "BASE_IMAGE",
    "ENDED_ERROR",
    "ENDED_SUBMITTED",
    "DockerSandbox",
    "EngineError",
    "EnvError",
    "Environment",
    "ExecResult",
    "GradeResult",
    "LocalSandbox",
    "Sandbox",
    "SandboxError",
    "Step",
    "Task",
    "TaskError",
    "Validation",
    "build_base_image",
    "build_task_image",
    "filter_tasks",
    "grade",
    "load_tasks",
    "open_sandbox",
    "reap_containers",
    "validate_task",
]
