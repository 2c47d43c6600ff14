"""The episode interface shared by SWE episodes and toy environments.

An environment speaks text: `reset()` gives the first user message, `step(action_text)` takes
the assistant's whole reply and answers with the next observation. Token handling (chat
template, masks, log-probs) belongs to the agent loop, never to the environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

# Why an episode ended; the agent loop adds "max_turns" and "context" itself.
ENDED_SUBMITTED = "submitted"
ENDED_ERROR = "error"


@dataclass(frozen=True)
class Step:
    """What the environment answers to one assistant reply."""

    observation: str
    done: bool = False
    format_error: bool = False  # the reply broke the action format; RFT masks this turn
    ended_by: str | None = None  # set when done: "submitted" or "error"
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    """A multi-turn text environment with a binary (or shaped) final reward."""

    system_prompt: str

    def reset(self) -> str: ...

    def step(self, action_text: str) -> Step: ...

    def reward(self) -> float:
        """Final reward once done (e.g. 1.0 if the submitted patch resolves the task)."""
        ...

    def close(self) -> None: ...
