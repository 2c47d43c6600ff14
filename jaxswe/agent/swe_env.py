"""A SWE task as an `envs.base.Environment`: scaffold commands in a sandbox, graded on submit.

`reset()` opens the task's sandbox and returns the instance message; `step(reply)` parses one
reply and runs its command; `submit` takes the patch (`git add -A` + `git diff --cached` against
the starting HEAD), closes the sandbox and ends the episode; `reward()` grades the patch in a
FRESH sandbox (1.0 if resolved). The sandbox is closed on every path, exceptions included.

Honest rewards: a grading error (test_patch does not apply to the clean base, the test command
cannot start) raises GradingError, so the agent loop records an infrastructure failure that RL
excludes; what the policy causes is scored 0 and never excluded: a command that kills its sandbox
(or runs it out of memory) ends the episode as "error" with reward 0, a file name a sandbox call
rejects is an observation, a patch that breaks test_patch or tampers with grading grades 0.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from envs.base import ENDED_ERROR, ENDED_SUBMITTED, Step
from jaxswe.agent.commands import Command, FormatError, parse_action
from jaxswe.agent.prompts import Prompts, load_prompts, render
from jaxswe.agent.scaffold import SandboxLike, Scaffold


class GradingError(RuntimeError):
    """Grading failed for a reason outside the policy (the task or the infrastructure)."""


class SWEEnv:
    """One episode on one task. Not reusable: make a new SWEEnv per episode."""

    def __init__(
        self,
        task: Any,
        *,
        backend: str = "local",
        sandbox_factory: Callable[[Any], SandboxLike] | None = None,
        grader: Callable[[Any, str], Any] | None = None,
        prompts: Prompts | str = "default",
        window_lines: int = 100,
        command_timeout_s: float = 60.0,
        output_limit_chars: int = 8000,
        demonstration: bool = False,
        demonstration_in_trained_prompt: bool = False,
        sandbox_limits: dict[str, Any] | None = None,
        test_timeout_s: float = 600.0,
        test_case_timeout_s: float = 120.0,
    ) -> None:
        self.task = task
        self.backend = backend
        limits = dict(sandbox_limits or {})
        self._closed = threading.Event()  # set by close: a sandbox opening meanwhile is closed too
        self._lock = threading.Lock()
        self._open = sandbox_factory or (
            lambda t: _envs().open_sandbox(t, backend, stop=self._closed, timeout=command_timeout_s, **limits)
        )
        timeouts = {"test_timeout": test_timeout_s, "case_timeout": test_case_timeout_s}
        self._grade = grader or (lambda t, patch: _envs().grade(t, patch, backend, **timeouts, **limits))
        self.prompts = prompts if isinstance(prompts, Prompts) else load_prompts(prompts)
        self.window_lines = window_lines
        self.command_timeout_s = command_timeout_s
        self.output_limit_chars = output_limit_chars
        self.demonstration = demonstration
        self.demonstration_in_trained_prompt = demonstration_in_trained_prompt
        # the first message as trained on, when it differs from the one sampled with (the demo)
        self.trained_first_message: str | None = None
        self.system_prompt = render(self.prompts.system, window_lines=window_lines)
        self.sandbox: SandboxLike | None = None
        self.scaffold: Scaffold | None = None
        self.patch: str | None = None
        self.grade_result: Any = None
        self._start_tree: str | None = None
        self._reward: float | None = None

    @classmethod
    def from_config(cls, task: Any, config: Any, **overrides: Any) -> SWEEnv:
        """Build from a RunConfig's `env` and `agent` sections."""
        kwargs = {
            "backend": config.env.backend,
            "prompts": config.agent.prompts,
            "window_lines": config.agent.window_lines,
            "command_timeout_s": config.env.command_timeout_s,
            "test_timeout_s": config.env.test_timeout_s,
            "test_case_timeout_s": config.env.test_case_timeout_s,
            "output_limit_chars": config.env.output_limit_chars,
            "demonstration": config.agent.demonstration,
            "demonstration_in_trained_prompt": config.agent.demonstration_in_trained_prompt,
        }
        if config.env.backend == "docker":
            engine_pool(config)  # env.docker_hosts: open_sandbox takes sandboxes from this pool
            kwargs["sandbox_limits"] = {
                "mem_limit": config.env.memory_limit,
                "cpus": config.env.cpu_limit,
                "pids_limit": config.env.pids_limit,
            }
        kwargs.update(overrides)
        return cls(task, **kwargs)

    @property
    def task_id(self) -> str:
        return self.task.instance_id

    @property
    def tamper(self) -> tuple[str, ...]:
        """Why grading flagged the submitted patch as tampering (empty if it did not, or not graded yet)."""
        return tuple(getattr(self.grade_result, "tamper", ()) or ())

    @property
    def flags(self) -> tuple[str, ...]:
        """The grading tripwires the submitted patch matched (flags for a reader; the reward stands)."""
        return tuple(getattr(self.grade_result, "flags", ()) or ())

    @property
    def test_statuses(self) -> dict[str, str]:
        """Grading's status of each graded test (FAIL_TO_PASS, then PASS_TO_PASS; empty if not graded)."""
        tests = getattr(self.grade_result, "tests", None) or {}
        graded = (*self.task.fail_to_pass, *self.task.pass_to_pass)
        return {t: str(tests[t]) for t in graded if t in tests}

    # ------------------------------------------------------------------ Environment
    def reset(self) -> str:
        if self.sandbox is not None or self.patch is not None or self._closed.is_set():
            raise RuntimeError("SWEEnv is single-use; make a new one per episode")
        sandbox = self._open(self.task)
        with self._lock:  # closed while it opened (a cancelled episode): nobody else would close it
            late = self._closed.is_set()
            if not late:
                self.sandbox = sandbox
        if late:
            sandbox.close()
            raise RuntimeError("the episode was closed while its sandbox was opening")
        try:
            self.scaffold = Scaffold(
                self.sandbox,
                self.prompts,
                window_lines=self.window_lines,
                command_timeout_s=self.command_timeout_s,
                output_limit_chars=self.output_limit_chars,
            )
            self._start_tree = self.scaffold.start_tree()
        except BaseException:
            self.close()
            raise
        first = functools.partial(
            render,
            self.prompts.instance,
            problem_statement=self.task.problem_statement.strip(),
            workdir=self.sandbox.workdir,
        )
        if self.demonstration and self.prompts.demonstration and not self.demonstration_in_trained_prompt:
            self.trained_first_message = first(demonstration="")
        return first(demonstration=self.prompts.demonstration if self.demonstration else "")

    def step(self, action_text: str) -> Step:
        if self.scaffold is None or self.sandbox is None:
            raise RuntimeError("step() before reset() or after the episode ended")
        action = parse_action(action_text)
        if isinstance(action, FormatError):
            return Step(
                self.scaffold.format_error(action), format_error=True, info={"format_error": action.kind}
            )
        try:
            if isinstance(action, Command) and action.name == "submit":
                self.patch = self.scaffold.diff_patch(self._start_tree)
                self.close()
                return Step("", done=True, ended_by=ENDED_SUBMITTED, info={"patch": self.patch})
            kind = action.name if isinstance(action, Command) else "usage_error"
            observation = self.scaffold.run(action)
            if getattr(self.sandbox, "dead", False):  # the policy's command killed its sandbox: scored 0
                self.close()
                info = {"command": kind, "sandbox_dead": True}
                return Step(observation, done=True, ended_by=ENDED_ERROR, info=info)
            return Step(observation, info={"command": kind})
        except BaseException:
            self.close()
            raise

    def reward(self) -> float:
        """1.0 if the submitted patch resolves the task (graded once, in a fresh sandbox), else 0.0."""
        if self.patch is None:
            return 0.0
        if self._reward is None:
            self.grade_result = self._grade(self.task, self.patch)
            if getattr(self.grade_result, "error", False):
                raise GradingError(f"grading {self.task_id} failed: {self.grade_result.reason}")
            resolved = getattr(self.grade_result, "resolved", self.grade_result)
            self._reward = 1.0 if resolved else 0.0
        return self._reward

    def close(self) -> None:
        with self._lock:
            self._closed.set()
            sandbox, self.sandbox, self.scaffold = self.sandbox, None, None
        if sandbox is not None:
            sandbox.close()

    def __enter__(self) -> SWEEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def engine_pool(config: Any) -> Any:
    """The process's pool of the Docker engines of a RunConfig's `env.docker_hosts` (configured once;
    None when the list is empty: sandboxes go to the DOCKER_HOST engine alone, as without a pool)."""
    from envs.provision.engines import ensure_configured

    if config.env.backend != "docker":
        return None
    hosts = [h.model_dump() for h in config.env.docker_hosts]
    return ensure_configured(hosts, health_interval_s=config.env.docker_health_interval_s)


def _envs() -> Any:
    import envs

    return envs
