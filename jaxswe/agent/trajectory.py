"""Token-exact multi-turn trajectories and the chat-template pieces they are built from.

A trajectory only ever grows by appending ids: the rendered prompt (system + first user message +
assistant header), each generated turn exactly as sampled, then each observation rendered alone
as the next user message + assistant header. History is never re-tokenized, so the ids trained on
are the ids the rollout engine saw and sampled.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from jaxswe.errors import UserError

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
    """One episode as token ids with masks, rollout log-probs and its outcome."""

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
    reward: float | None = None
    patch: str | None = None
    infra_error: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

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

    # ---------------------------------------------------------------- views
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

    def arrays(self) -> dict[str, np.ndarray]:
        """input_ids int32 [T], loss_mask int32 [T], rollout_logprobs float32 [T],
        policy_versions int32 [T]."""
        return {
            "input_ids": np.asarray(self.input_ids, dtype=np.int32),
            "loss_mask": np.asarray(self.loss_mask, dtype=np.int32),
            "rollout_logprobs": np.asarray(self.rollout_logprobs, dtype=np.float32),
            "policy_versions": np.asarray(self.policy_versions, dtype=np.int32),
        }

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
    def to_json(self, *, text: str | None = None) -> dict[str, Any]:
        record = asdict(self)
        if text is not None:
            record["text"] = text
        return record

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> Trajectory:
        if not isinstance(record, dict):
            raise TrajectoryError("bad trajectory record: not a JSON object")
        record = {k: v for k, v in record.items() if k != "text"}
        if "policy_versions" not in record:  # written before versions were recorded: unknown
            record["policy_versions"] = [-1] * len(record.get("input_ids", []))
        try:
            record["turns"] = [Turn(**t) for t in record.get("turns", [])]
            traj = cls(**record)
            traj.check()
        except (TypeError, ValueError) as err:
            raise TrajectoryError(f"bad trajectory record: {err}") from None
        return traj


def save_jsonl(trajectories: list[Trajectory], path: str | Path, *, tokenizer: Any = None) -> None:
    """One trajectory per line; with a tokenizer each line also holds the decoded `text`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        for traj in trajectories:
            text = None
            if tokenizer is not None:
                text = tokenizer.decode(
                    traj.input_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
                )
            f.write(json.dumps(traj.to_json(text=text), ensure_ascii=False) + "\n")
    tmp.replace(path)


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
