"""A toy multi-turn environment for RL learning tests: find the hidden key.

Each episode hides a key, an integer in `0..num_values-1`, drawn from the environment's own
seeded RNG (so two `ToyEnv`s with the same seed present the same keys, episode after episode).
The whole assistant reply, surrounding whitespace ignored, must be one action:

- `look`: the observation reveals the key, e.g. `key 5`; the episode goes on.
- `submit N`: the episode ends (ended_by "submitted"); reward 1.0 if N is the key, else 0.0.

Anything else (including `submit N` with N out of range) is a format error: the observation says
so and the episode goes on, but the `max_format_errors`-th one (2 by default) ends the episode
(ended_by "error", reward 0). Looking first and submitting the seen key always wins, in two turns;
submitting blind wins with probability 1/num_values. The turn limit belongs to the agent loop.

With `require_look=True` a submission made before any `look` in the episode is a format error
("error: look first"; the episode goes on): a blind guess can neither win nor end the episode, so
every reward needs several turns and depends on what was observed.

With `show_answer=True` the `look` observation also spells out the winning action,
`key 5 -> submit 5`: winning means repeating text seen a turn earlier. A tiny random model
learns that from RL faster than mapping the key's digit onto the action (in the RL learning test,
with 2 values: success about 1.0 after 20 iterations, against the 0.5 of looking and guessing).
"""

from __future__ import annotations

import random
import re

from envs.base import ENDED_ERROR, ENDED_SUBMITTED, Step
from envs.errors import EnvError

_ACTION = re.compile(r"look|submit (\d+)")

# Terse on purpose: every prompt token dilutes a random-init model's attention to the observation.
SYSTEM_PROMPT = "find the key"


class ToyEnv:
    """The find-the-hidden-key game; implements `envs.base.Environment`."""

    system_prompt = SYSTEM_PROMPT

    def __init__(
        self,
        seed: int,
        num_values: int = 8,
        *,
        max_format_errors: int = 2,
        require_look: bool = False,
        show_answer: bool = False,
    ):
        if not 2 <= num_values <= 100:
            raise EnvError(f"ToyEnv num_values must be in 2..100, got {num_values}")
        if max_format_errors < 1:
            raise EnvError(f"ToyEnv max_format_errors must be >= 1, got {max_format_errors}")
        self.num_values = num_values
        self.max_format_errors = max_format_errors
        self.require_look = require_look
        self.show_answer = show_answer
        self._rng = random.Random(seed)
        self._key: int | None = None
        self._done = False
        self._solved = False
        self._looked = False
        self._format_errors = 0

    def reset(self) -> str:
        """Start a new episode with a freshly drawn key; returns the first user message."""
        self._key = self._rng.randrange(self.num_values)
        self._done = False
        self._solved = False
        self._looked = False
        self._format_errors = 0
        return "look then submit"

    def step(self, action_text: str) -> Step:
        if self._key is None:
            raise EnvError("ToyEnv.step() called before reset()")
        if self._done:
            raise EnvError("ToyEnv.step() called after the episode ended; call reset()")
        match = _ACTION.fullmatch(action_text.strip())
        if match is None or (match[1] is not None and int(match[1]) >= self.num_values):
            return self._format_error()
        if match[1] is None:
            self._looked = True
            seen = f"key {self._key} -> submit {self._key}" if self.show_answer else f"key {self._key}"
            return Step(observation=seen, info={"action": "look"})
        if self.require_look and not self._looked:
            return self._format_error("error: look first")
        self._done = True
        self._solved = int(match[1]) == self._key
        return Step(
            observation="correct" if self._solved else "wrong",
            done=True,
            ended_by=ENDED_SUBMITTED,
            info={"action": "submit"},
        )

    def _format_error(self, message: str | None = None) -> Step:
        self._format_errors += 1
        if self._format_errors >= self.max_format_errors:
            self._done = True
            return Step(
                observation="error: too many invalid actions",
                done=True,
                format_error=True,
                ended_by=ENDED_ERROR,
                info={"action": None},
            )
        return Step(
            observation=message or f"error: reply with look or submit N (N in 0-{self.num_values - 1})",
            format_error=True,
            info={"action": None},
        )

    def reward(self) -> float:
        """1.0 once the right key was submitted in this episode, else 0.0."""
        return 1.0 if self._solved else 0.0

    def close(self) -> None:
        self._done = True


def make_toy_envs(n: int, seed: int, num_values: int = 8) -> list[ToyEnv]:
    """`n` independent environments whose seeds are derived from `seed` (reproducible)."""
    if n < 0:
        raise EnvError(f"make_toy_envs needs n >= 0, got {n}")
    rng = random.Random(seed)
    return [ToyEnv(rng.getrandbits(63), num_values) for _ in range(n)]
