"""The rollout record (token-exact multi-turn trajectories) and the chat-template pieces it is
built from.

A trajectory only ever grows by appending ids: the rendered prompt (system + first user message +
assistant header), each generated turn exactly as sampled, then each observation rendered alone
as the next user message + assistant header. History is never re-tokenized, so the ids trained on
are the ids the rollout engine saw and sampled.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from jaxswe.distributed import is_main
from jaxswe.errors import UserError
from jaxswe.packing import Sequence
from jaxswe.run.files import write_text_atomic

ENDED_BY = ("submitted", "max_turns", "context", "error")
_PLACEHOLDER = "\u2063JAXSWE_SLOT\u2063"


class TrajectoryError(UserError):
    """A trajectory file or record that cannot be read."""


@dataclass(frozen=True)
class ChatFormat:
    """The chat template cut into the pieces a token-exact loop needs.

    `end_of_turn_id` closes an assistant turn (e.g. `<|im_end|>`); `user_prefix`/`user_suffix`
    wrap an observation so that `user_prefix + text + user_suffix` is exactly what the template
    puts after a generated end-of-turn token and before the model's next turn.
    """

    tokenizer: Any
    end_of_turn_id: int
    end_of_turn: str
    user_prefix: str
    user_suffix: str

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> ChatFormat:
        """Derive the pieces from the tokenizer's own chat template (Qwen ChatML and the like).

        The end-of-turn token is the special token the template writes right after an assistant
        message's content (`<|im_end|>` for ChatML, whatever the tokenizer's eos token is).
        """
        if not getattr(tokenizer, "chat_template", None):
            raise TrajectoryError("the tokenizer has no chat_template")
        slot = _PLACEHOLDER
        base = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
        turn = [*base, {"role": "assistant", "content": slot}]
        before = _render(tokenizer, turn, False)
        after = _render(tokenizer, [*turn, {"role": "user", "content": slot}], True)
        if before.count(slot) != 1 or not after.startswith(before) or after.count(slot) != 2:
            raise TrajectoryError("the chat template does not render turns as an append-only sequence")
        tail = before.split(slot)[1]
        specials = sorted(set(tokenizer.all_special_tokens) | set(tokenizer.get_added_vocab()), key=len)
        end = next((tok for tok in reversed(specials) if tail.startswith(tok)), None)
        if end is None:
            raise TrajectoryError(f"no special token ends an assistant message in the template ({tail!r})")
        piece = tail[len(end) :] + after[len(before) :]
        prefix, suffix = piece.split(slot)
        return cls(tokenizer, tokenizer.convert_tokens_to_ids(end), end, prefix, suffix)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, system: str, user: str) -> list[int]:
        """System + first user message + assistant header, rendered by the template."""
        text = _render(
            self.tokenizer, [{"role": "system", "content": system}, {"role": "user", "content": user}], True
        )
        return self.encode(text)

    def observation_ids(self, observation: str) -> list[int]:
        """The next user message and assistant header, tokenized alone."""
        return self.encode(self.user_prefix + observation + self.user_suffix)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def action_text(self, generated_ids: list[int]) -> str:
        """What the environment reads: the generated turn without its end-of-turn token(s)."""
        ids = list(generated_ids)
        specials = set(getattr(self.tokenizer, "all_special_ids", ())) | {self.end_of_turn_id}
        while ids and ids[-1] in specials:
            ids.pop()
        return self.decode(ids)


def _render(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


@dataclass
class Turn:
    """One assistant turn: ids [start, end) of the trajectory, end-of-turn token included."""

    start: int
    end: int
    format_error: bool = False
    finish_reason: str = "stop"
    num_generated: int = 0  # sampled tokens; an end-of-turn appended after a length stop is not counted


@dataclass
class Trajectory:
    """One episode from sampler to loss: token ids with masks, rollout log-probs and policy
    versions, its turns and decoded conversation, and its outcome. The stages keep, pickle
    between processes and save (`save_jsonl`) this one record."""

    task_id: str = ""
    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)  # 1 exactly on sampled assistant tokens
    rollout_logprobs: list[float] = field(default_factory=list)  # aligned; 0.0 where not sampled
    # aligned: the policy (weight) version that sampled each token; -1 where not sampled or not
    # reported. An episode whose turn spanned a weight update holds two versions.
    policy_versions: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    messages: list[dict[str, str]] = field(default_factory=list)  # decoded conversation, for reading
    prompt_len: int = 0
    ended_by: str | None = None
    reward: float | None = None  # the environment's outcome (1 = resolved); None for an infra failure
    patch: str | None = None
    infra_error: str | None = None  # the infrastructure failed: excluded from RL, never scored 0
    tamper: list[str] = field(default_factory=list)  # grading's tamper flags (the reward is then 0)
    flags: list[str] = field(default_factory=list)  # grading's tripwires (for a reader; the reward stands)
    tests: dict[str, str] = field(default_factory=dict)  # grading's status of each graded test
    timings: dict[str, float] = field(default_factory=dict)  # env_s, model_s, reward_s, total_s
    # the prompt the episode was sampled with when it is not the one trained on (a demonstration)
    sampled_prompt_ids: list[int] | None = None
    # the stage's bookkeeping: RL's shaped_reward, advantage and group_kept; RFT's sample slot
    stage: dict[str, Any] = field(default_factory=dict)

    # ---------------------------------------------------------------- building
    def append(
        self,
        ids: list[int],
        *,
        trained: bool,
        logprobs: list[float] | None = None,
        versions: list[int] | None = None,
    ) -> None:
        for name, values in (("logprobs", logprobs), ("versions", versions)):
            if values is not None and len(values) != len(ids):
                raise ValueError(f"{len(ids)} ids but {len(values)} {name}")
        self.input_ids.extend(int(i) for i in ids)
        self.loss_mask.extend([int(trained)] * len(ids))
        self.rollout_logprobs.extend(
            [float(x) for x in logprobs] if logprobs is not None else [0.0] * len(ids)
        )
        self.policy_versions.extend([int(v) for v in versions] if versions is not None else [-1] * len(ids))

    def replace_prompt(self, prompt_ids: list[int]) -> None:
        """Swap the prompt (ids [0, prompt_len)) for `prompt_ids`, keeping the turns token for token;
        the sampled prompt moves to `sampled_prompt_ids`."""
        shift = len(prompt_ids) - self.prompt_len
        self.sampled_prompt_ids = self.input_ids[: self.prompt_len]
        n = len(prompt_ids)
        self.input_ids = [int(t) for t in prompt_ids] + self.input_ids[self.prompt_len :]
        self.loss_mask = [0] * n + self.loss_mask[self.prompt_len :]
        self.rollout_logprobs = [0.0] * n + self.rollout_logprobs[self.prompt_len :]
        self.policy_versions = [-1] * n + self.policy_versions[self.prompt_len :]
        self.turns = [replace(t, start=t.start + shift, end=t.end + shift) for t in self.turns]
        self.prompt_len = n

    # ---------------------------------------------------------------- views
    @property
    def resolved(self) -> bool:
        return self.infra_error is None and (self.reward or 0.0) >= 1.0

    @property
    def tampered(self) -> bool:
        return bool(self.tamper)

    @property
    def grading_s(self) -> float:
        return float(self.timings.get("reward_s", 0.0))

    @property
    def num_generated(self) -> int:
        return int(sum(self.loss_mask))

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def format_errors(self) -> list[bool]:
        return [t.format_error for t in self.turns]

    @property
    def turn_spans(self) -> list[tuple[int, int]]:
        return [(t.start, t.end) for t in self.turns]

    @property
    def is_infra_failure(self) -> bool:
        """Excluded from RL (not scored 0): the episode broke for reasons outside the policy."""
        return self.infra_error is not None

    def rft_loss_mask(self) -> np.ndarray:
        """`loss_mask` with format-error turns zeroed (they stay in context, out of the loss)."""
        mask = np.asarray(self.loss_mask, dtype=np.int32).copy()
        for t in self.turns:
            if t.format_error:
                mask[t.start : t.end] = 0
        return mask

    def rl_sequence(self, advantage: float) -> Sequence:
        """What RL packs: the sampled tokens with the rollout's log-probs, versions and `advantage`."""
        return Sequence(
            np.asarray(self.input_ids, np.int32),
            np.asarray(self.loss_mask, np.float32),
            rollout_logprobs=np.asarray(self.rollout_logprobs, np.float32),
            advantage=advantage,
            policy_versions=np.asarray(self.policy_versions, np.int32),
        )

    def sft_sequence(self) -> Sequence:
        """What RFT packs: `rft_loss_mask` over the same ids."""
        return Sequence(np.asarray(self.input_ids, np.int32), self.rft_loss_mask().astype(np.float32))

    def check(self) -> None:
        """Raise ValueError if the fields are inconsistent."""
        n = len(self.input_ids)
        if len(self.loss_mask) != n or len(self.rollout_logprobs) != n or len(self.policy_versions) != n:
            raise ValueError("input_ids, loss_mask, rollout_logprobs and policy_versions differ in length")
        if self.ended_by is not None and self.ended_by not in ENDED_BY:
            raise ValueError(f"ended_by {self.ended_by!r} not in {ENDED_BY}")
        if self.infra_error is not None and (self.ended_by != "error" or self.reward is not None):
            raise ValueError("an infra failure must end by 'error' with no reward")
        mask = np.asarray(self.loss_mask)
        in_turns = np.zeros(n, dtype=bool)
        for t in self.turns:
            if not 0 <= t.start <= t.end <= n:
                raise ValueError(f"turn span {t.start}:{t.end} outside 0:{n}")
            in_turns[t.start : t.end] = True
        if np.any(mask.astype(bool) & ~in_turns):
            raise ValueError("loss_mask covers tokens outside assistant turns")
        if np.any((np.asarray(self.rollout_logprobs) != 0.0) & ~mask.astype(bool)):
            raise ValueError("rollout_logprobs set on untrained tokens")
        versions = np.asarray(self.policy_versions, dtype=np.int64)
        if np.any(versions < -1) or np.any((versions != -1) & ~mask.astype(bool)):
            raise ValueError("policy_versions must be >= 0 on sampled tokens and -1 elsewhere")

    # ---------------------------------------------------------------- JSON
    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> Trajectory:
        if not isinstance(record, dict):
            raise TrajectoryError("bad trajectory record: not a JSON object")
        record = dict(record)
        try:
            record["turns"] = [Turn(**t) for t in record.get("turns", [])]
            traj = cls(**record)
            traj.check()
        except (TypeError, ValueError) as err:
            raise TrajectoryError(f"bad trajectory record: {err}") from None
        return traj


def save_jsonl(path: str | Path, trajectories: list[Trajectory]) -> None:
    """One trajectory per line, written atomically (a killed write leaves the old file); process 0
    only."""
    if not is_main():
        return
    write_text_atomic(path, (json.dumps(t.to_json(), ensure_ascii=False) + "\n" for t in trajectories))


def load_jsonl(path: str | Path) -> list[Trajectory]:
    """Read trajectories written by `save_jsonl`; a bad line raises TrajectoryError naming it."""
    path = Path(path)
    if not path.is_file():
        raise TrajectoryError(f"{path}: trajectory file not found")
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(Trajectory.from_json(json.loads(line)))
        except (json.JSONDecodeError, TrajectoryError) as err:
            raise TrajectoryError(f"{path}:{i}: {err}") from None
    return out
